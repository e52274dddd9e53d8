"""The per-epoch plan of a whole elastic job, and its two baselines.

For every epoch the planner asks the freeze policy how many units are frozen (:mod:`elastic_pipe.freeze`), decides
whether the activation cache pays for that boundary (:func:`elastic_pipe.cache.decide`), and then picks the fastest
layout that fits memory among the pipeline lengths that divide the GPU count and do not exceed the previous epoch's
(the pipeline only compresses, as in PipeTransformer; freed GPUs become replicas). Each candidate length is
partitioned by :func:`elastic_pipe.partition.solve` and its step is simulated with
:func:`elastic_pipe.schedule.simulate` for the micro-batch counts the published practice searches, ``[K, 6K]``
(see :mod:`elastic_pipe.planner.step`).

Baselines, with the same model, global batch, epochs and cost model:

* **static**: no freezing, the best layout over every pipeline length (DDP when the model fits one GPU and that
  is fastest);
* **freeze-only**: the elastic job's first layout kept for good (same stages, same micro-batches), its layers
  freezing on the same schedule and its prefix cached on the same rule, but never re-partitioned or compressed.

The cache holds the output of one boundary. An epoch whose frozen count grew reads the boundary it holds,
recomputes the newly frozen units forward-only and writes the new boundary (the published cache fills during
the first epoch at a new boundary); the next epoch reads it. Cached activations are assumed to stay readable after
a re-shard (the host tier is shared per node); a reshard that moves samples across nodes is not priced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elastic_pipe.cache import decide
from elastic_pipe.freeze import frozen_by_epoch, make_policy
from elastic_pipe.partition.compress import divisors
from elastic_pipe.planner.cluster import ClusterSpec
from elastic_pipe.planner.costs import SubLayerCost
from elastic_pipe.planner.errors import PlannerError
from elastic_pipe.planner.step import Mode, StepPrediction, microbatch_cost, partition_entries, predict_step
from elastic_pipe.schedule import GENERATORS, ScheduleError, tune_microbatches

__all__ = ["CACHE_TIERS", "EpochPlan", "JobSpec", "Plan", "make_plan"]

#: Cache tiers, fastest first; ``auto`` takes the first whose capacity holds the replica's share.
CACHE_TIERS = ("gpu", "host", "disk")
#: Micro-batch counts tried per pipeline length K: ``K * j`` (the published search covered ``[K, 6K]``).
MICROBATCH_MULTIPLES = (1, 2, 3, 4, 5, 6)
#: Micro-batch counts tried without a pipeline (gradient accumulation only helps when memory is short).
DDP_MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
#: Relative digits below which two simulated makespans count as equal when ranking micro-batch counts.
TIE_DIGITS = 6
#: Stages per rank for the interleaved schedule.
INTERLEAVED_CHUNKS = 2


def _default_policy_options() -> dict[str, Any]:
    return {"alpha": 1 / 3}


@dataclass(frozen=True)
class JobSpec:
    """The training job to plan.

    Attributes:
        global_batch: samples per optimizer step over all replicas (kept fixed as replicas change).
        epochs: epochs to plan.
        steps_per_epoch: optimizer steps per epoch.
        policy: a freeze policy name of :data:`elastic_pipe.freeze.POLICIES` that decides from the epoch alone.
        policy_options: the policy's keyword options (``alpha`` for ``alpha``).
        frozen: an explicit frozen-unit count per epoch; overrides ``policy``.
        pipe_len: the initial pipeline length; ``None`` takes the fastest layout that fits memory.
        schedule: pipeline schedule kind ("1f1b", "gpipe", "zb1p", "interleaved").
        microbatches: a fixed micro-batch count per step and replica; ``None`` searches ``[K, 6K]``.
        cache: cache the frozen prefix's activations (where it pays).
        cache_tier: "auto" or one of :data:`CACHE_TIERS`.
        dataset_size: samples per epoch (for cache capacity); default ``global_batch * steps_per_epoch``.
        transition_seconds: cost of one reshape (moving stages, rebuilding groups); published ~17 s, assumed 5 s.
        solver: partition solver name.
    """

    global_batch: int
    epochs: int
    steps_per_epoch: int
    policy: str = "alpha"
    policy_options: Mapping[str, Any] = field(default_factory=_default_policy_options)
    frozen: tuple[int, ...] | None = None
    pipe_len: int | None = None
    schedule: str = "1f1b"
    microbatches: int | None = None
    cache: bool = True
    cache_tier: str = "auto"
    dataset_size: int | None = None
    transition_seconds: float = 5.0
    solver: str = "optimal"

    def __post_init__(self) -> None:
        for key in ("global_batch", "epochs", "steps_per_epoch"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"JobSpec.{key} must be an integer >= 1, got {value!r}")
        for key in ("pipe_len", "microbatches", "dataset_size"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise PlannerError(f"JobSpec.{key} must be None or an integer >= 1, got {value!r}")
        if self.schedule not in GENERATORS:
            raise PlannerError(f"unknown schedule {self.schedule!r}; expected one of {sorted(GENERATORS)}")
        if self.cache_tier not in ("auto", *CACHE_TIERS):
            raise PlannerError(f"unknown cache tier {self.cache_tier!r}; expected one of {['auto', *CACHE_TIERS]}")
        if not (math.isfinite(self.transition_seconds) and self.transition_seconds >= 0):
            raise PlannerError(f"JobSpec.transition_seconds must be finite and >= 0, got {self.transition_seconds!r}")
        if self.frozen is not None and len(self.frozen) != self.epochs:
            raise PlannerError(f"JobSpec.frozen needs one count per epoch ({self.epochs}), got {self.frozen!r}")

    @property
    def chunks(self) -> int:
        """Stages per rank the schedule needs."""
        return INTERLEAVED_CHUNKS if self.schedule == "interleaved" else 1

    @property
    def samples_per_epoch(self) -> int:
        """Samples the cache has to hold per boundary."""
        return self.dataset_size if self.dataset_size is not None else self.global_batch * self.steps_per_epoch


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
        transition_seconds: reshape cost paid at the start of this epoch.
        why: one sentence per decision: what froze, how the prefix is served, why this layout.
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

    @property
    def pipe_len(self) -> int:
        """Pipeline length K."""
        return self.step.pipe_len

    @property
    def replicas(self) -> int:
        """Pipeline replicas."""
        return self.step.replicas

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


@dataclass(frozen=True)
class _Variant:
    """How the frozen prefix is handled in one epoch."""

    frozen: int
    cached: int
    writes: bool
    tier: str | None
    source: str | None = None  # the tier holding boundary ``cached`` (where this epoch reads from)

    @property
    def read_tier(self) -> str | None:
        """Where the cached boundary is read from: the tier it was written to, else this epoch's tier."""
        return self.source or self.tier


class _Evaluator:
    """Predicts steps for (variant, K, M), memoised: plans revisit the same layouts often."""

    def __init__(self, costs: Sequence[SubLayerCost], cluster: ClusterSpec, job: JobSpec) -> None:
        self.costs = tuple(costs)
        self.cluster = cluster
        self.job = job
        self.memo: dict[tuple[Any, ...], StepPrediction | None] = {}
        # Per-sample output bytes at each unit boundary (boundary u: output of the last sub-layer of unit u-1).
        self.boundary_bytes: dict[int, float] = {}
        self.recompute: dict[int, float] = {0: 0.0}
        for i, c in enumerate(self.costs):
            if c.unit is not None:
                self.boundary_bytes[c.unit + 1] = c.output_bytes
                self.recompute[c.unit + 1] = math.fsum(x.frozen_forward for x in self.costs[: i + 1])

    def first_layer(self, cached: int) -> int:
        return sum(1 for c in self.costs if c.unit is not None and c.unit < cached)

    def entries(self, v: _Variant, keep_cached: bool) -> list[tuple[SubLayerCost, Mode]]:
        out = []
        for c in self.costs:
            if c.unit is not None and c.unit < v.cached:
                if keep_cached:
                    out.append((c, Mode.CACHED))
            elif c.unit is not None and c.unit < v.frozen:
                out.append((c, Mode.FROZEN))
            else:
                out.append((c, Mode.ACTIVE))
        return out

    def bandwidth(self, tier: str | None) -> float:
        c = self.cluster
        return {"gpu": c.gpu_cache_bandwidth, "host": c.host_bandwidth, "disk": c.disk_bandwidth}.get(tier or "", 0.0)

    def cache_seconds(self, v: _Variant) -> float:
        if v.tier is None:
            return 0.0
        read = self.boundary_bytes[v.cached] / self.bandwidth(v.read_tier) if v.cached else 0.0
        write = self.boundary_bytes[v.frozen] / self.bandwidth(v.tier) if v.writes else 0.0
        return read + write

    def tier_fits(self, tier: str, v: _Variant, pred: StepPrediction) -> bool:
        need_per_sample = max(self.boundary_bytes.get(v.cached, 0.0), self.boundary_bytes.get(v.frozen, 0.0))
        per_replica = math.ceil(self.job.samples_per_epoch / pred.replicas) * need_per_sample
        if tier == "gpu":
            return pred.stage_memory[0] + per_replica <= self.cluster.gpu.usable_memory
        if tier == "host":
            replicas_per_node = max(1, self.cluster.gpus_on_a_node // pred.pipe_len)
            return per_replica * replicas_per_node <= self.cluster.host_cache_memory
        return True

    def microbatch_options(self, pipe_len: int) -> tuple[int, ...]:
        if self.job.microbatches is not None:
            return (self.job.microbatches,)
        if pipe_len == 1 and self.job.chunks == 1:
            return DDP_MICROBATCHES
        return tuple(pipe_len * j for j in MICROBATCH_MULTIPLES)

    def predict(
        self, v: _Variant, pipe_len: int, microbatches: int, fixed: tuple[int, ...] | None = None
    ) -> StepPrediction | None:
        key = (v, pipe_len, microbatches, fixed)
        if key not in self.memo:
            try:
                self.memo[key] = predict_step(
                    self.entries(v, keep_cached=fixed is not None),
                    self.cluster,
                    global_batch=self.job.global_batch,
                    pipe_len=pipe_len,
                    microbatches=microbatches,
                    schedule=self.job.schedule,
                    chunks=self.job.chunks,
                    cache_seconds_per_sample=self.cache_seconds(v),
                    layers_per_stage=fixed,
                    solver=self.job.solver,
                )
            except (PlannerError, ScheduleError):
                self.memo[key] = None  # this K or M cannot be scheduled (too few layers or samples)
        return self.memo[key]

    def best_for(self, v: _Variant, pipe_len: int) -> StepPrediction | None:
        """The fastest micro-batch count that fits memory for one pipeline length.

        :func:`elastic_pipe.schedule.tune_microbatches` ranks the candidates by simulated makespan on the
        partition balanced at ``M = K``; the ranked counts are then predicted in full (re-partitioned at their
        own size, all-reduce and memory included) until one fits.
        """
        replicas = self.cluster.gpus // pipe_len
        if self.job.global_batch % replicas:
            return None  # the global batch does not split evenly over this many replicas
        per_replica = self.job.global_batch // replicas
        options = [m for m in self.microbatch_options(pipe_len) if m <= per_replica]
        entries = self.entries(v, keep_cached=False)
        stages = pipe_len * self.job.chunks
        if not options or len(entries) < stages:
            return None
        counts = partition_entries(entries, stages, per_replica / options[0], self.cluster, self.job.solver)
        cost = microbatch_cost(
            entries, counts, self.cluster, pipe_len=pipe_len, cache_seconds_per_sample=self.cache_seconds(v)
        )
        try:
            choice = tune_microbatches(
                cost, per_replica, pipe_len, kind=self.job.schedule, chunks=self.job.chunks, candidates=options
            )
        except ScheduleError:
            return None  # no candidate divides the batch or suits the schedule
        # Counts within a rounding error of each other tie; the fewest micro-batches wins (larger kernels).
        fastest = min(r.makespan for r in choice.table) or 1.0
        for row in sorted(choice.table, key=lambda r: (round(r.makespan / fastest, TIE_DIGITS), r.microbatches)):
            pred = self.predict(v, pipe_len, row.microbatches)
            if pred is not None and pred.fits:
                return pred
        return None

    def best(
        self, v: _Variant, lengths: Sequence[int]
    ) -> tuple[tuple[StepPrediction, _Variant] | None, dict[int, float | None]]:
        """Fastest fitting layout over ``lengths``, choosing the cache tier where ``v`` uses the cache.

        Returns:
            The winner (or ``None``) and, per length tried, its best throughput (``None``: nothing fits).
        """
        found: tuple[StepPrediction, _Variant] | None = None
        options: dict[int, float | None] = {}
        for k in lengths:
            options[k] = None
            for tiered in self.tier_variants(v):
                pred = self.best_for(tiered, k)
                if pred is None or (tiered.tier and not self.tier_fits(tiered.tier, tiered, pred)):
                    continue
                options[k] = self.job.global_batch / pred.step_time
                if found is None or pred.step_time < found[0].step_time:
                    found = (pred, tiered)
                break  # the fastest tier that fits wins for this length
        return found, options

    def tier_variants(self, v: _Variant) -> list[_Variant]:
        """The cache tiers to try for ``v``, fastest first, keeping those where reading beats recomputing."""
        if v.tier is None:
            return [v]
        tiers = CACHE_TIERS if self.job.cache_tier == "auto" else (self.job.cache_tier,)
        return [replace(v, tier=t) for t in tiers if self.cache_pays(v.frozen, t)]

    def cache_pays(self, frozen: int, tier: str) -> bool:
        """The published rule: cache a boundary only when reading it beats recomputing the prefix."""
        read = self.boundary_bytes[frozen] / self.bandwidth(tier)
        return decide(read, self.recompute[frozen]).enabled


def _frozen_schedule(units: int, job: JobSpec) -> tuple[int, ...]:
    if job.frozen is not None:
        bad = [f for f in job.frozen if not 0 <= f <= units]
        if bad or any(b < a for a, b in zip(job.frozen, job.frozen[1:], strict=False)):
            raise PlannerError(f"frozen counts must be non-decreasing within 0..{units}, got {job.frozen!r}")
        return job.frozen
    policy = make_policy(job.policy, units, **dict(job.policy_options))
    return frozen_by_epoch(policy, job.epochs, job.steps_per_epoch)


def _variant(frozen: int, held: tuple[int, str | None], job: JobSpec) -> _Variant:
    """The cache variant of an epoch (its tier is picked later), or full recompute without a cache.

    ``held`` is the boundary the cache holds and the tier it sits in (``(0, None)``: empty).
    """
    if not job.cache or frozen == 0:
        return _Variant(frozen, 0, False, None)
    boundary, source = held
    start = boundary if 0 < boundary <= frozen else 0
    return _Variant(frozen, start, frozen > start, "auto", source if start else None)


def _epoch(
    e: int, job: JobSpec, ev: _Evaluator, pred: StepPrediction, v: _Variant, *, transition: float = 0.0
) -> EpochPlan:
    return EpochPlan(
        epoch=e,
        frozen=v.frozen,
        cached=v.cached,
        cache_tier=v.tier,
        first_layer=ev.first_layer(v.cached),
        step=pred,
        steps=job.steps_per_epoch,
        global_batch=job.global_batch,
        transition_seconds=transition,
    )


def _units(start: int, stop: int) -> str:
    return f"unit {start}" if stop == start + 1 else f"units {start}..{stop - 1}"


def _explain(
    epoch: EpochPlan, previous: EpochPlan | None, used: _Variant, options: dict[int, float | None], job: JobSpec
) -> str:
    """Why an epoch looks the way it does, in a few clauses."""
    parts = []
    if previous is None:
        parts.append(f"start at the given pipe_len={job.pipe_len}" if job.pipe_len else "start at the fastest layout")
    elif epoch.frozen > previous.frozen:
        parts.append(f"froze {_units(previous.frozen, epoch.frozen)}")
    if used.tier is not None:
        source = f"read boundary {used.cached} from the {used.read_tier} cache" if used.cached else "no cache yet"
        fill = (
            f", recompute {_units(used.cached, used.frozen)} and write boundary {used.frozen} to the {used.tier} cache"
            if used.writes
            else ""
        )
        parts.append(source + fill)
    elif epoch.frozen:
        parts.append(f"recompute the {epoch.frozen} frozen units (cache off or not paying)")
    others = [
        f"K={k}: {'does not fit' if tp is None else f'{tp:,.0f}/s'}" for k, tp in options.items() if k != epoch.pipe_len
    ]
    layout = f"K={epoch.pipe_len} x {epoch.replicas}, M={epoch.step.microbatches}, {epoch.throughput:,.0f}/s"
    parts.append(layout + (f" beats {'; '.join(others)}" if others else ""))
    return "; ".join(parts)


def make_plan(costs: Sequence[SubLayerCost], cluster: ClusterSpec, job: JobSpec, *, model: str = "custom") -> Plan:
    """Plan an elastic job and its baselines.

    Args:
        costs: per-sample sub-layer costs in model order (:func:`~elastic_pipe.planner.price` of a built-in model's
            work, or :func:`~elastic_pipe.planner.from_layer_costs` of measured records).
        cluster: the cluster.
        job: the job.
        model: a name for reports.

    Returns:
        The plan.

    Raises:
        PlannerError: no layout fits memory, a given ``pipe_len`` that does not fit or divide the GPUs, or costs
            without freezable units.
        FreezeError: a policy that needs gradient statistics, or bad policy options.
    """
    units = len({c.unit for c in costs if c.unit is not None})
    if units == 0:
        raise PlannerError("the costs have no freezable unit (every sub-layer has unit None)")
    frozen = _frozen_schedule(units, job)
    ev = _Evaluator(costs, cluster, job)
    all_lengths = [k for k in divisors(cluster.gpus) if k * job.chunks <= len(costs)]
    if job.pipe_len is not None and job.pipe_len not in all_lengths:
        raise PlannerError(
            f"pipe_len={job.pipe_len} must divide the {cluster.gpus} GPUs and leave a sub-layer per stage; "
            f"expected one of {all_lengths}"
        )

    plain = _Variant(0, 0, False, None)
    static_best, _ = ev.best(plain, all_lengths)
    if static_best is None:
        worst = min(
            (
                max(p.stage_memory)
                for k in all_lengths
                for m in ev.microbatch_options(k)
                if (p := ev.predict(plain, k, m))
            ),
            default=math.inf,
        )
        raise PlannerError(
            f"the model fits no layout of {cluster.gpus} GPUs with {cluster.gpu.usable_memory / 2**30:.1f} GiB usable "
            f"each: the best needs {worst / 2**30:.1f} GiB per GPU (add GPUs or memory, or lower the batch)"
        )
    static = tuple(_epoch(e, job, ev, static_best[0], plain) for e in range(job.epochs))

    first_lengths = [job.pipe_len] if job.pipe_len is not None else all_lengths
    elastic: list[EpochPlan] = []
    held: tuple[int, str | None] = (0, None)
    for e, f in enumerate(frozen):
        allowed = first_lengths if e == 0 else [k for k in all_lengths if k <= elastic[-1].pipe_len]
        v = _variant(f, held, job)
        found, options = ev.best(v, allowed)
        if found is None and v.tier is not None:
            v = _Variant(f, 0, False, None)
            found, options = ev.best(v, allowed)
        if found is None:
            raise PlannerError(f"epoch {e}: no pipeline length in {allowed} fits memory with {f} frozen units")
        pred, used = found
        previous = elastic[-1] if elastic else None
        moved = previous is not None and pred.pipe_len != previous.pipe_len
        epoch = _epoch(e, job, ev, pred, used, transition=job.transition_seconds if moved else 0.0)
        elastic.append(replace(epoch, why=_explain(epoch, previous, used, options, job)))
        if used.tier is not None:
            held = (used.frozen, used.tier)

    start = elastic[0].step
    # The fixed partition covers every sub-layer; cached ones at epoch 0 (an explicit schedule) sit on stage 0.
    fixed = (start.layers_per_stage[0] + elastic[0].first_layer, *start.layers_per_stage[1:])
    freeze_only: list[EpochPlan] = []
    held = (0, None)
    for e, f in enumerate(frozen):
        v = _variant(f, held, job)
        pred_fixed: StepPrediction | None = None
        for tiered in [*ev.tier_variants(v), _Variant(f, 0, False, None)]:
            pred_fixed = ev.predict(tiered, start.pipe_len, start.microbatches, fixed)
            if pred_fixed is not None and (tiered.tier is None or ev.tier_fits(tiered.tier, tiered, pred_fixed)):
                v = tiered
                break
        if pred_fixed is None:
            raise PlannerError(f"epoch {e}: the fixed initial layout cannot be simulated with {f} frozen units")
        freeze_only.append(_epoch(e, job, ev, pred_fixed, v))
        if v.tier is not None:
            held = (v.frozen, v.tier)

    return Plan(
        model=model,
        layer_names=tuple(c.name for c in costs),
        units=units,
        cluster=cluster,
        job=job,
        epochs=tuple(elastic),
        static=static,
        freeze_only=tuple(freeze_only),
    )
