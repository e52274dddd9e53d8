"""The layout search behind a plan: for one epoch's frozen prefix, the fastest layout that fits.

A :class:`CacheVariant` says how an epoch serves its frozen prefix (recomputed, or read from a cache tier at some
boundary, maybe filling a new one). :class:`LayoutSearch` predicts steps for (variant, pipeline length,
micro-batches), memoised because a plan revisits layouts often: for each length it ranks the micro-batch counts
with :func:`elastic_pipe.schedule.tune_microbatches`, predicts the best ranked ones in full with
:func:`~elastic_pipe.planner.step.predict_step` until one fits memory, and picks the fastest cache tier whose
capacity holds a replica's share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from elastic_pipe.cache import decide
from elastic_pipe.planner.cluster import ClusterSpec
from elastic_pipe.planner.costs import SubLayerCost
from elastic_pipe.planner.errors import PlannerError
from elastic_pipe.planner.job import CACHE_TIERS, JobSpec
from elastic_pipe.planner.step import Mode, StepPrediction, microbatch_cost, partition_entries, predict_step
from elastic_pipe.schedule import ScheduleError, tune_microbatches

__all__ = ["DDP_MICROBATCHES", "MICROBATCH_MULTIPLES", "CacheVariant", "LayoutSearch"]

#: Micro-batch counts tried per pipeline length K: ``K * j`` (the published search covered ``[K, 6K]``).
MICROBATCH_MULTIPLES = (1, 2, 3, 4, 5, 6)
#: Micro-batch counts tried without a pipeline (gradient accumulation only helps when memory is short).
DDP_MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
#: Relative digits below which two simulated makespans count as equal when ranking micro-batch counts.
TIE_DIGITS = 6


@dataclass(frozen=True)
class CacheVariant:
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


class LayoutSearch:
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

    def entries(self, v: CacheVariant, keep_cached: bool) -> list[tuple[SubLayerCost, Mode]]:
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

    def cache_seconds(self, v: CacheVariant) -> float:
        if v.tier is None:
            return 0.0
        read = self.boundary_bytes[v.cached] / self.bandwidth(v.read_tier) if v.cached else 0.0
        write = self.boundary_bytes[v.frozen] / self.bandwidth(v.tier) if v.writes else 0.0
        return read + write

    def fill_seconds(self, v: CacheVariant, held: int, held_tier: str | None) -> float:
        """Seconds a stage-0 rank spends in the transition extending the cache from boundary ``held`` (in
        ``held_tier``; 0: from the input) to ``v.cached`` for every training sample (``cache_fill="transition"``):
        read the held boundary, recompute the newly frozen units forward-only, write the new boundary."""
        if self.job.cache_fill != "transition" or v.tier is None or v.cached <= held:
            return 0.0
        start = held if held > 0 else 0
        read = self.boundary_bytes[start] / self.bandwidth(held_tier) if start and held_tier else 0.0
        recompute = self.recompute[v.cached] - self.recompute[start]
        write = self.boundary_bytes[v.cached] / self.bandwidth(v.tier)
        return self.job.samples_per_epoch * (read + recompute + write)

    def tier_fits(self, tier: str, v: CacheVariant, pred: StepPrediction) -> bool:
        need_per_sample = max(self.boundary_bytes.get(v.cached, 0.0), self.boundary_bytes.get(v.frozen, 0.0))
        # Filled in the transition, every stage-0 rank caches the whole training set (a rank is handed different
        # samples each epoch); filled while training, a rank caches its share.
        share = self.job.samples_per_epoch
        if self.job.cache_fill == "epoch":
            share = math.ceil(share / pred.replicas)
        per_rank = share * need_per_sample
        if tier == "gpu":
            return pred.stage_memory[0] + per_rank <= self.cluster.gpu.usable_memory
        if tier == "host":
            replicas_per_node = max(1, self.cluster.gpus_on_a_node // pred.pipe_len)
            return per_rank * replicas_per_node <= self.cluster.host_cache_memory
        return True

    def microbatch_options(self, pipe_len: int) -> tuple[int, ...]:
        if self.job.microbatches is not None:
            return (self.job.microbatches,)
        if pipe_len == 1 and self.job.chunks == 1:
            return DDP_MICROBATCHES
        return tuple(pipe_len * j for j in MICROBATCH_MULTIPLES)

    def predict(
        self,
        v: CacheVariant,
        pipe_len: int,
        microbatches: int,
        fixed: tuple[int, ...] | None = None,
        *,
        virtual: int | None = None,
        schedule: str | None = None,
    ) -> StepPrediction | None:
        """The step of (variant, K, M) under ``schedule`` (default: the job's) with ``virtual`` stages per rank
        (default: the job's :attr:`~elastic_pipe.planner.JobSpec.chunks`); ``None`` when it cannot be
        scheduled."""
        key = (v, pipe_len, microbatches, fixed, virtual, schedule)
        if key not in self.memo:
            try:
                self.memo[key] = predict_step(
                    self.entries(v, keep_cached=fixed is not None),
                    self.cluster,
                    global_batch=self.job.global_batch,
                    pipe_len=pipe_len,
                    microbatches=microbatches,
                    schedule=self.job.schedule if schedule is None else schedule,
                    chunks=self.job.chunks if virtual is None else virtual,
                    cache_seconds_per_sample=self.cache_seconds(v),
                    layers_per_stage=fixed,
                    solver=self.job.solver,
                )
            except (PlannerError, ScheduleError):
                self.memo[key] = None  # this K or M cannot be scheduled (too few layers or samples)
        return self.memo[key]

    def best_for(self, v: CacheVariant, pipe_len: int) -> StepPrediction | None:
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
        self, v: CacheVariant, lengths: Sequence[int]
    ) -> tuple[tuple[StepPrediction, CacheVariant] | None, dict[int, float | None]]:
        """Fastest fitting layout over ``lengths``, choosing the cache tier where ``v`` uses the cache.

        Returns:
            The winner (or ``None``) and, per length tried, its best throughput (``None``: nothing fits).
        """
        found: tuple[StepPrediction, CacheVariant] | None = None
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

    def tier_variants(self, v: CacheVariant) -> list[CacheVariant]:
        """The cache tiers to try for ``v``, fastest first, keeping those where reading beats recomputing."""
        if v.tier is None:
            return [v]
        tiers = CACHE_TIERS if self.job.cache_tier == "auto" else (self.job.cache_tier,)
        return [replace(v, tier=t) for t in tiers if self.cache_pays(v.frozen, t)]

    def cache_pays(self, frozen: int, tier: str) -> bool:
        """The published rule: cache a boundary only when reading it beats recomputing the prefix."""
        read = self.boundary_bytes[frozen] / self.bandwidth(tier)
        return decide(read, self.recompute[frozen]).enabled
