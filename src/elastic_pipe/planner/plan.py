"""The per-epoch plan of a whole elastic job, and its two baselines.

For every epoch the planner asks the freeze policy how many units are frozen (:mod:`elastic_pipe.freeze`), decides
whether the activation cache pays for that boundary (:func:`elastic_pipe.cache.decide`), and then picks the fastest
layout that fits memory among the pipeline lengths that divide the GPU count and do not exceed the previous epoch's
(the pipeline only compresses, as in PipeTransformer; freed GPUs become replicas), keeping the previous length
when a reshape, at this epoch's saving per epoch, would not pay for its transition by the end of the job. Each
candidate length is partitioned by :func:`elastic_pipe.partition.solve` and its step is simulated with
:func:`elastic_pipe.schedule.simulate` for the micro-batch counts the published practice searches, ``[K, 6K]``
(see :mod:`elastic_pipe.planner.step`).

Baselines, with the same model, global batch, epochs and cost model:

* **static**: no freezing, the best layout over every pipeline length (DDP when the model fits one GPU and that
  is fastest);
* **freeze-only**: the elastic job's first layout kept for good (same stages, same micro-batches), its layers
  freezing on the same schedule and its prefix cached on the same rule, but never re-partitioned or compressed.

The cache holds the output of one boundary. With ``cache_fill="epoch"`` an epoch whose frozen count grew reads
the boundary it holds, recomputes the newly frozen units forward-only and writes the new boundary (the published
cache fills during the first epoch at a new boundary); the next epoch reads it. With ``cache_fill="transition"``
(this package's orchestrator) the transition extends the cache to the new boundary for every training sample,
priced into the epoch's ``transition_seconds``, and the epoch only reads. Cached activations are assumed to stay
readable after a re-shard (the host tier is shared per node); a reshard that moves samples across nodes is not
priced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from elastic_pipe.freeze import frozen_by_epoch, make_policy
from elastic_pipe.partition import divisors
from elastic_pipe.planner.cluster import ClusterSpec
from elastic_pipe.planner.costs import SubLayerCost, check_costs
from elastic_pipe.planner.errors import CHECK, PlannerError
from elastic_pipe.planner.job import INTERLEAVED_CHUNKS, VIRTUAL_AUTO, JobSpec
from elastic_pipe.planner.result import EpochPlan, Plan
from elastic_pipe.planner.search import TIE_DIGITS, CacheVariant, LayoutSearch
from elastic_pipe.planner.step import StepPrediction

__all__ = ["make_plan"]


def _frozen_schedule(units: int, job: JobSpec) -> tuple[int, ...]:
    if job.frozen is not None:
        bad = [f for f in job.frozen if not 0 <= f <= units]
        if bad or any(b < a for a, b in zip(job.frozen, job.frozen[1:], strict=False)):
            raise PlannerError(f"frozen counts must be non-decreasing within 0..{units}, got {job.frozen!r}")
        return job.frozen
    policy = make_policy(job.policy, units, **dict(job.policy_options))
    return frozen_by_epoch(policy, job.epochs, job.steps_per_epoch)


def _variant(frozen: int, held: tuple[int, str | None], job: JobSpec) -> CacheVariant:
    """The cache variant of an epoch (its tier is picked later), or full recompute without a cache.

    ``held`` is the boundary the cache holds and the tier it sits in (``(0, None)``: empty).
    """
    if not job.cache or frozen == 0:
        return CacheVariant(frozen, 0, False, None)
    if job.cache_fill == "transition":
        return CacheVariant(frozen, frozen, False, "auto")  # filled in the transition: read the new boundary
    boundary, source = held
    start = boundary if 0 < boundary <= frozen else 0
    return CacheVariant(frozen, start, frozen > start, "auto", source if start else None)


def _choose_virtual(
    ev: LayoutSearch, v: CacheVariant, pred: StepPrediction
) -> tuple[StepPrediction, tuple[StepPrediction, ...]]:
    """Under ``JobSpec.virtual = "auto"``: every v the schedule runs predicted at ``pred``'s K and M, and the
    fastest that fits memory (steps within :data:`~elastic_pipe.planner.search.TIE_DIGITS` relative digits tie,
    and the smaller v wins a tie); ``pred`` itself when the job's v is fixed."""
    if ev.job.virtual != VIRTUAL_AUTO:
        return pred, ()
    options = tuple(
        p
        for c in ev.job.virtual_candidates
        if (p := ev.predict(v, pred.pipe_len, pred.microbatches, virtual=c)) is not None
    )
    fitting = [p for p in options if p.fits] or [pred]
    fastest = min(p.step_time for p in fitting) or 1.0
    return min(fitting, key=lambda p: (round(p.step_time / fastest, TIE_DIGITS), p.chunks)), options


def _epoch(
    e: int,
    job: JobSpec,
    ev: LayoutSearch,
    pred: StepPrediction,
    v: CacheVariant,
    *,
    transition: float = 0.0,
    options: tuple[StepPrediction, ...] = (),
) -> EpochPlan:
    # The job's v is planned (under "auto" the fastest v at the layout's K and M, ``options`` the steps of every v);
    # with one stage per rank fixed, the interleaved step of the same K and M is reported beside it, never chosen.
    interleaved = None
    if pred.chunks == 1 and pred.pipe_len > 1 and job.virtual != VIRTUAL_AUTO:
        interleaved = ev.predict(
            v, pred.pipe_len, pred.microbatches, virtual=INTERLEAVED_CHUNKS, schedule="interleaved"
        )
    return EpochPlan(
        epoch=e,
        frozen=v.frozen,
        cached=v.cached,
        cache_tier=v.tier,
        # A fixed partition (kept layout) covers every sub-layer, cached ones on stage 0; otherwise they are gone.
        first_layer=0 if sum(pred.layers_per_stage) == len(ev.costs) else ev.first_layer(v.cached),
        step=pred,
        steps=job.steps_per_epoch,
        global_batch=job.global_batch,
        transition_seconds=transition,
        interleaved=interleaved,
        virtual_options=options,
    )


def _stay(ev: LayoutSearch, v: CacheVariant, previous: EpochPlan) -> tuple[StepPrediction, CacheVariant] | None:
    """The best step at the previous epoch's pipeline length; when the remaining sub-layers are too few for its
    stages, the previous partition kept with the cached sub-layers on stage 0 (as the freeze-only baseline)."""
    found, _ = ev.best(v, [previous.pipe_len])
    if found is not None:
        return found
    counts = previous.step.layers_per_stage
    fixed = (counts[0] + previous.first_layer, *counts[1:])
    for tiered in [*ev.tier_variants(v), CacheVariant(v.frozen, 0, False, None)]:
        pred = ev.predict(tiered, previous.pipe_len, previous.step.microbatches, fixed, virtual=previous.step.chunks)
        if pred is not None and pred.fits and (tiered.tier is None or ev.tier_fits(tiered.tier, tiered, pred)):
            return pred, tiered
    return None


def _units(start: int, stop: int) -> str:
    return f"unit {start}" if stop == start + 1 else f"units {start}..{stop - 1}"


def _explain(
    epoch: EpochPlan,
    previous: EpochPlan | None,
    used: CacheVariant,
    options: dict[int, float | None],
    job: JobSpec,
    *,
    fill: float = 0.0,
) -> str:
    """Why an epoch looks the way it does, in a few clauses."""
    parts = []
    if previous is None:
        parts.append(f"start at the given pipe_len={job.pipe_len}" if job.pipe_len else "start at the fastest layout")
    elif epoch.frozen > previous.frozen:
        parts.append(f"froze {_units(previous.frozen, epoch.frozen)}")
    if fill:
        parts.append(f"the transition fills boundary {used.cached} in the {used.tier} cache ({fill:.3g} s)")
    if used.tier is not None:
        source = f"read boundary {used.cached} from the {used.read_tier} cache" if used.cached else "no cache yet"
        writes = (
            f", recompute {_units(used.cached, used.frozen)} and write boundary {used.frozen} to the {used.tier} cache"
            if used.writes
            else ""
        )
        parts.append(source + writes)
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
    check_costs("costs", costs)
    CHECK.instance("cluster", cluster, ClusterSpec)
    CHECK.instance("job", job, JobSpec)
    CHECK.str("model", model)
    units = len({c.unit for c in costs if c.unit is not None})
    if units == 0:
        raise PlannerError("the costs have no freezable unit (every sub-layer has unit None)")
    frozen = _frozen_schedule(units, job)
    ev = LayoutSearch(costs, cluster, job)
    all_lengths = [k for k in divisors(cluster.gpus) if k * job.chunks <= len(costs)]
    if job.pipe_len is not None and job.pipe_len not in all_lengths:
        raise PlannerError(
            f"pipe_len={job.pipe_len} must divide the {cluster.gpus} GPUs and leave a sub-layer per stage; "
            f"expected one of {all_lengths}"
        )

    plain = CacheVariant(0, 0, False, None)
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
    static_step, static_options = _choose_virtual(ev, plain, static_best[0])
    static = tuple(_epoch(e, job, ev, static_step, plain, options=static_options) for e in range(job.epochs))

    first_lengths = [job.pipe_len] if job.pipe_len is not None else all_lengths
    elastic: list[EpochPlan] = []
    held: tuple[int, str | None] = (0, None)
    for e, f in enumerate(frozen):
        allowed = first_lengths if e == 0 else [k for k in all_lengths if k <= elastic[-1].pipe_len]
        v = _variant(f, held, job)
        found, options = ev.best(v, allowed)
        if found is None and v.tier is not None:
            v = CacheVariant(f, 0, False, None)
            found, options = ev.best(v, allowed)
        if found is None:
            raise PlannerError(f"epoch {e}: no pipeline length in {allowed} fits memory with {f} frozen units")
        previous = elastic[-1] if elastic else None
        note = ""
        if previous is not None and found[0].pipe_len != previous.pipe_len:
            stay = _stay(ev, v, previous)
            # Judged over the rest of the job at this epoch's saving (later epochs usually save more).
            left = job.epochs - e
            saved = left * job.steps_per_epoch * (stay[0].step_time - found[0].step_time) if stay else math.inf
            if stay is not None and saved < job.transition_seconds:
                note = (
                    f"kept K={previous.pipe_len}: K={found[0].pipe_len} would save {saved:.3g} s over the "
                    f"{left} epochs left, less than its {job.transition_seconds:g} s transition"
                )
                found = stay
                options = {}  # the note says why; no "beats" list
        pred, used = found
        pred, chosen = _choose_virtual(ev, used, pred)
        moved = previous is not None and (pred.pipe_len, pred.chunks) != (previous.pipe_len, previous.virtual)
        fill = ev.fill_seconds(used, *held)
        epoch = _epoch(
            e, job, ev, pred, used, transition=(job.transition_seconds if moved else 0.0) + fill, options=chosen
        )
        why = _explain(epoch, previous, used, options, job, fill=fill)
        elastic.append(replace(epoch, why=f"{why}; {note}" if note else why))
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
        for tiered in [*ev.tier_variants(v), CacheVariant(f, 0, False, None)]:
            pred_fixed = ev.predict(tiered, start.pipe_len, start.microbatches, fixed, virtual=start.chunks)
            if pred_fixed is not None and (tiered.tier is None or ev.tier_fits(tiered.tier, tiered, pred_fixed)):
                v = tiered
                break
        if pred_fixed is None:
            raise PlannerError(f"epoch {e}: the fixed initial layout cannot be simulated with {f} frozen units")
        freeze_only.append(_epoch(e, job, ev, pred_fixed, v, transition=ev.fill_seconds(v, *held)))
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
