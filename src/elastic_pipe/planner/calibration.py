"""Predictions to hold against measured runs: pure functions that take the measurements as arguments.

The library keeps no measurements. The measured numbers, the readers of ``benchmarks/results/*.json`` and the
runs that time this machine live in ``benchmarks/planner_calibration.py``; docs/planner.md ("Calibration") prints
the tables it produces.

* :func:`layout_step`: one layout's step with a frozen prefix, recomputed or read from a GPU cache;
* :func:`relative_step_cost`: such a step over the step without freezing;
* :func:`predict_arms`: per steady epoch, the throughput of measured runs (:class:`ArmMeasurement`) as the
  planner predicts it, and each run's steady run time;
* :class:`CalibrationRow` and :func:`format_rows`: a measured quantity, its prediction, a Markdown table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastic_pipe.planner.cluster import ClusterSpec, GpuSpec
from elastic_pipe.planner.costs import SubLayerCost
from elastic_pipe.planner.errors import PlannerError
from elastic_pipe.planner.job import JobSpec
from elastic_pipe.planner.plan import make_plan
from elastic_pipe.planner.step import Mode, StepPrediction, predict_step

__all__ = [
    "BARE_LOOP_GPU",
    "WARMUP_EPOCHS",
    "ArmMeasurement",
    "CalibrationRow",
    "format_rows",
    "frozen_entries",
    "layout_step",
    "predict_arms",
    "relative_step_cost",
]

#: A GPU timed in a bare training loop (``examples/plan_calibrate.py``): the batch already on the device (no data
#: phase), fused AdamW (one kernel over all tensors, no per-tensor Python loop), no device synchronisation between
#: phases (the host's own per-step work runs ahead, hidden behind queued GPU work). The defaults of
#: :class:`GpuSpec` describe the package's orchestrator instead, which pays those per-step costs.
BARE_LOOP_GPU = GpuSpec(data_overhead=0.0, pass_overhead=0.0, optimizer_sublayer_overhead=0.0)
#: Leading epochs of a measured run left out by default: the first epoch carries the job's warm-up (CUDA and
#: NCCL initialisation, allocator growth, autotuning), which the cost model does not describe.
WARMUP_EPOCHS = 1


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One measured quantity and its prediction.

    Attributes:
        name: what was measured.
        unit: its unit.
        measured: the measured value.
        predicted: the cost model's value.
    """

    name: str
    unit: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative error of the prediction, ``predicted / measured - 1``."""
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True, slots=True)
class ArmMeasurement:
    """One measured run ("arm") of a benchmark, in one layout throughout.

    Attributes:
        name: the arm's name.
        frozen: frozen units per epoch.
        cache: whether the frozen prefix was read from the activation cache (filled in the transitions).
        samples_per_s: measured throughput per epoch (transitions excluded).
        epoch_seconds: measured seconds per epoch (transitions excluded).
        pipe_len: pipeline stages (1: DDP over every GPU).
        microbatches: micro-batches per step and replica.
        schedule: the pipeline schedule kind.
    """

    name: str
    frozen: tuple[int, ...]
    cache: bool
    samples_per_s: tuple[float, ...]
    epoch_seconds: tuple[float, ...]
    pipe_len: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if not self.frozen or not len(self.frozen) == len(self.samples_per_s) == len(self.epoch_seconds):
            raise PlannerError(
                f"arm {self.name!r} needs one frozen count, throughput and duration per epoch, got "
                f"{len(self.frozen)}, {len(self.samples_per_s)} and {len(self.epoch_seconds)}"
            )


def frozen_entries(costs: Sequence[SubLayerCost], frozen: int, *, cached: bool) -> list[tuple[SubLayerCost, Mode]]:
    """The sub-layers with the first ``frozen`` units frozen: recomputed, or read from a cache when ``cached``."""
    out = []
    for c in costs:
        if c.unit is not None and c.unit < frozen:
            out.append((c, Mode.CACHED if cached else Mode.FROZEN))
        else:
            out.append((c, Mode.ACTIVE))
    return out


def _boundary_bytes(costs: Sequence[SubLayerCost], frozen: int) -> float:
    last = [c for c in costs if c.unit is not None and c.unit < frozen]
    return last[-1].output_bytes if last else 0.0


def layout_step(
    costs: Sequence[SubLayerCost],
    cluster: ClusterSpec,
    *,
    batch: int,
    frozen: int = 0,
    cached: bool = False,
    pipe_len: int = 1,
    microbatches: int = 1,
) -> StepPrediction:
    """One step of ``batch`` samples with ``frozen`` units frozen, recomputed or (``cached``) read from GPU memory."""
    read = _boundary_bytes(costs, frozen) / cluster.gpu_cache_bandwidth if cached else 0.0
    return predict_step(
        frozen_entries(costs, frozen, cached=cached),
        cluster,
        global_batch=batch,
        pipe_len=pipe_len,
        microbatches=microbatches,
        cache_seconds_per_sample=read,
    )


def relative_step_cost(
    costs: Sequence[SubLayerCost], cluster: ClusterSpec, frozen: int, *, cached: bool, batch: int
) -> float:
    """One-device step time with ``frozen`` units frozen (recomputed or read from a GPU cache) over the full step."""
    full = layout_step(costs, cluster, batch=batch).step_time
    return layout_step(costs, cluster, batch=batch, frozen=frozen, cached=cached).step_time / full


def predict_arms(
    arms: Mapping[str, ArmMeasurement],
    costs: Sequence[SubLayerCost],
    cluster: ClusterSpec,
    *,
    global_batch: int,
    steps_per_epoch: int,
    warmup_epochs: int = WARMUP_EPOCHS,
    model: str = "custom",
) -> list[CalibrationRow]:
    """Predict measured runs: one row per steady epoch, then one per arm for its steady run time.

    Every arm is planned as it ran: its frozen counts, its layout (pipeline length, micro-batches, schedule), the
    cache on or off and filled in the transitions (``cache_fill="transition"``, as the orchestrator does). The
    first ``warmup_epochs`` epochs of each arm are left out. Measured throughput and epoch times exclude
    transitions, and so do the predictions.

    Args:
        arms: measured arms by name.
        costs: the model's per-sample sub-layer costs on the cluster's GPU.
        cluster: the cluster the arms ran on.
        global_batch: samples per step.
        steps_per_epoch: steps per epoch.
        warmup_epochs: leading epochs of every arm left out.
        model: the model's name in the plans.

    Returns:
        Per steady epoch "<arm>, epoch e (f frozen)" in samples/s, and per arm "<arm>, steady epochs: run time" in
        seconds (the sum over its steady epochs).
    """
    rows: list[CalibrationRow] = []
    for name, arm in arms.items():
        job = JobSpec(
            global_batch=global_batch,
            epochs=len(arm.frozen),
            steps_per_epoch=steps_per_epoch,
            frozen=arm.frozen,
            pipe_len=arm.pipe_len,
            microbatches=arm.microbatches,
            schedule=arm.schedule,
            cache=arm.cache,
            cache_fill="transition",
        )
        plan = make_plan(costs, cluster, job, model=model)
        steady = range(warmup_epochs, len(arm.frozen))
        for e in steady:
            rows.append(
                CalibrationRow(
                    f"{name}, epoch {e} ({arm.frozen[e]} frozen)",
                    "samples/s",
                    arm.samples_per_s[e],
                    plan.epochs[e].throughput,
                )
            )
        if steady:
            rows.append(
                CalibrationRow(
                    f"{name}, steady epochs: run time",
                    "s",
                    math.fsum(arm.epoch_seconds[e] for e in steady),
                    math.fsum(plan.epochs[e].steps * plan.epochs[e].step.step_time for e in steady),
                )
            )
    return rows


#: Values at least this large print as whole numbers with thousands separators.
_WHOLE = 100


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= _WHOLE else f"{value:.3g}"


def format_rows(rows: Sequence[CalibrationRow]) -> str:
    """A Markdown table of calibration rows: measured, predicted and the relative error."""
    lines = ["| measured | unit | measured | predicted | error |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.name} | {r.unit} | {_number(r.measured)} | {_number(r.predicted)} | {r.error:+.1%} |")
    return "\n".join(lines)
