"""What a plan produces: one :class:`EpochPlan` per epoch, and the :class:`Plan` with its baselines and totals."""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic_pipe.planner.cluster import ClusterSpec
from elastic_pipe.planner.job import JobSpec
from elastic_pipe.planner.step import StepPrediction

__all__ = ["EpochPlan", "Plan"]


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of a plan.

    Attributes:
        epoch: 0-based epoch.
        frozen: frozen units.
        cached: the cache boundary read this epoch (units; 0: none).
        cache_tier: the tier read or filled, or ``None`` without a cache.
        first_layer: index of the first sub-layer the pipeline holds (sub-layers before it come from the cache).
        step: the predicted step (layout, partition, breakdown).
        steps: optimizer steps in the epoch.
        global_batch: samples per step.
        transition_seconds: paid at the start of this epoch: a reshape's cost, plus filling the cache when the
            job fills it in the transition.
        why: one sentence per decision: what froze, how the prefix is served, why this layout.
        interleaved: the same pipeline length and micro-batch count predicted with
            :data:`~elastic_pipe.planner.job.INTERLEAVED_CHUNKS` stages per rank (interleaved 1F1B), reported
            beside ``step`` and never chosen: a plan keeps the job's stages per rank (:attr:`JobSpec.virtual`, the
            run's ``[pipeline] virtual``). ``None`` when ``step`` already holds several stages per rank, for
            one-stage pipelines, and where interleaving does not apply (micro-batches not a multiple of K, too few
            sub-layers).
        virtual_options: under ``JobSpec.virtual = "auto"``, the step predicted with each v the schedule runs at
            this epoch's K and M (``step`` is the fastest of them that fits memory); empty for a fixed v.
    """

    epoch: int
    frozen: int
    cached: int
    cache_tier: str | None
    first_layer: int
    step: StepPrediction
    steps: int
    global_batch: int
    transition_seconds: float = 0.0
    why: str = ""
    interleaved: StepPrediction | None = None
    virtual_options: tuple[StepPrediction, ...] = ()

    @property
    def pipe_len(self) -> int:
        """Pipeline length K."""
        return self.step.pipe_len

    @property
    def replicas(self) -> int:
        """Pipeline replicas."""
        return self.step.replicas

    @property
    def virtual(self) -> int:
        """Stages per rank v of the planned step."""
        return self.step.chunks

    @property
    def throughput(self) -> float:
        """Samples per second in steady state."""
        return self.global_batch / self.step.step_time

    @property
    def seconds(self) -> float:
        """The epoch's predicted wall time, the transition included."""
        return self.steps * self.step.step_time + self.transition_seconds

    @property
    def boundaries(self) -> tuple[int, ...]:
        """Stage boundaries as global sub-layer offsets (stage ``s`` holds ``boundaries[s]:boundaries[s+1]``)."""
        out = [self.first_layer]
        for count in self.step.layers_per_stage:
            out.append(out[-1] + count)
        return tuple(out)


@dataclass(frozen=True)
class Plan:
    """A whole job: the elastic epochs and both baselines.

    Attributes:
        model: model name.
        layer_names: sub-layer names in order.
        units: freezable units.
        cluster: the cluster.
        job: the job.
        epochs: elastic epochs.
        static: the static baseline's epochs.
        freeze_only: the freeze-only baseline's epochs.
    """

    model: str
    layer_names: tuple[str, ...]
    units: int
    cluster: ClusterSpec
    job: JobSpec
    epochs: tuple[EpochPlan, ...]
    static: tuple[EpochPlan, ...]
    freeze_only: tuple[EpochPlan, ...]

    @property
    def seconds(self) -> float:
        """Predicted wall time of the elastic job."""
        return math.fsum(e.seconds for e in self.epochs)

    @property
    def static_seconds(self) -> float:
        """Predicted wall time of the static baseline."""
        return math.fsum(e.seconds for e in self.static)

    @property
    def freeze_only_seconds(self) -> float:
        """Predicted wall time of the freeze-only baseline."""
        return math.fsum(e.seconds for e in self.freeze_only)

    @property
    def speedup(self) -> float:
        """Static baseline time over elastic time."""
        return self.static_seconds / self.seconds

    @property
    def speedup_over_freeze_only(self) -> float:
        """Freeze-only time over elastic time: what reshaping adds to freezing."""
        return self.freeze_only_seconds / self.seconds

    @property
    def transitions(self) -> int:
        """Epoch boundaries where the frozen count or the pipeline length changes (a transition message)."""
        return sum(
            1
            for a, b in zip(self.epochs, self.epochs[1:], strict=False)
            if (a.frozen, a.pipe_len) != (b.frozen, b.pipe_len)
        )

    @property
    def reshapes(self) -> int:
        """Epoch boundaries where the pipeline length changes."""
        return sum(1 for a, b in zip(self.epochs, self.epochs[1:], strict=False) if a.pipe_len != b.pipe_len)
