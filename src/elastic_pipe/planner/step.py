"""Predict one training step of one layout: per-stage times, the simulated pipeline, all-reduce, memory.

The step of a replica is the makespan of its pipeline schedule, played by :func:`elastic_pipe.schedule.simulate`
with these per-stage costs (seconds per micro-batch of ``b`` samples):

* forward ``F_s = max(GPU_F_s + cache_s, host_F_s)`` and backward ``B_s = max(GPU_B_s, host_B_s)``: the GPU works
  while the host issues the next kernels, so a stage is bound by whichever is slower. ``host`` is the eager
  per-block, per-micro-batch launch cost (:attr:`~elastic_pipe.planner.GpuSpec.host_overhead`), which makes small
  micro-batches host-bound;
* ``cache_s`` (stage 0 only): reading the frozen prefix's output from the cache tier, plus writing the new
  boundary's output while the cache fills;
* a hop between stages: ``latency + bytes / bandwidth`` per message (NVLink inside a node, the NIC across nodes).

After the pipeline drains, every stage all-reduces its gradients over the replicas (ring:
``2 (R-1)/R * bytes / bandwidth + 2 (R-1) * step_latency``, not overlapped with compute, plus the sync's fixed
cost and a per-trained-sub-layer cost for flattening and copying back the gradients) and runs its optimizer
(bytes at memory bandwidth, a floor and a per-trained-sub-layer cost). Each step also pays fixed host work that
no GPU work hides: loading the batch (``data_overhead``) and the pipeline runtime's own work (``pass_overhead``).
The step time is split into compute (the busiest stage's own work), bubble (idle time of the simulated schedule
without transfers), transfers (what the hops add to the makespan), cache reads, all-reduce, optimizer and host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from elastic_pipe.partition import solve
from elastic_pipe.planner.cluster import ClusterSpec
from elastic_pipe.planner.costs import (
    FROZEN_BYTES_PER_PARAM,
    GRAD_BYTES_PER_PARAM,
    OPTIMIZER_BYTES_PER_PARAM,
    STATE_BYTES_PER_PARAM,
    SubLayerCost,
)
from elastic_pipe.planner.errors import CHECK, PlannerError, PlannerTypeError
from elastic_pipe.planner.job import MAX_MICROBATCHES, MAX_PIPE_LEN
from elastic_pipe.schedule import Simulation, StageTimes, generate, simulate

__all__ = [
    "Mode",
    "StepBreakdown",
    "StepPrediction",
    "gradient_sync_time",
    "microbatch_cost",
    "partition_entries",
    "predict_step",
    "ring_allreduce_time",
    "transfer_time",
]


class Mode(IntEnum):
    """How a sub-layer takes part in a step."""

    ACTIVE = 0  #: trains: forward and backward
    FROZEN = 1  #: recomputed forward-only under no_grad
    CACHED = 2  #: skipped: its output comes from the activation cache


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Where one step's time goes (seconds); the parts add up to :attr:`total`.

    Attributes:
        compute: the busiest stage's own forward and backward work over all micro-batches.
        bubble: pipeline fill and drain: the simulated schedule's extra time beyond ``compute`` without transfers.
        transfers: what point-to-point hops add to the makespan.
        cache_reads: the busiest stage's cache reads (and writes while the cache fills), when that is stage 0.
        allreduce: gradient all-reduce over the replicas (the slowest stage's).
        optimizer: the optimizer step (the slowest stage's).
        host: fixed host work per step outside the pipelined passes: loading the batch and the pipeline
            runtime's own work (loss, schedule bookkeeping) while the device waits.
    """

    compute: float
    bubble: float
    transfers: float
    cache_reads: float
    allreduce: float
    optimizer: float
    host: float = 0.0

    @property
    def bubble_fraction(self) -> float:
        """The schedule's idle share on the busiest rank, ``bubble / (compute + bubble)`` (0 without work)."""
        span = self.compute + self.bubble
        return self.bubble / span if span > 0 else 0.0

    @property
    def total(self) -> float:
        """The step time."""
        return (
            self.compute + self.bubble + self.transfers + self.cache_reads + self.allreduce + self.optimizer + self.host
        )


@dataclass(frozen=True, slots=True)
class StepPrediction:
    """One layout's predicted step.

    Attributes:
        pipe_len: pipeline ranks K.
        replicas: data-parallel pipeline replicas R.
        chunks: stages per rank (2 for the interleaved schedule).
        microbatches: micro-batches per step and replica M.
        micro_batch: samples per micro-batch.
        layers_per_stage: sub-layers per stage over the entries given (cached ones included when the partition
            was fixed, skipped otherwise).
        stage_memory: peak bytes per rank (parameters, optimizer state, stored activations).
        fits: whether every rank's memory fits the GPU's usable memory.
        host_bound: whether the busiest stage is bound by host work rather than GPU work.
        breakdown: the step's time split.
        simulation: the simulated schedule (with transfers), for timelines.
    """

    pipe_len: int
    replicas: int
    chunks: int
    microbatches: int
    micro_batch: float
    layers_per_stage: tuple[int, ...]
    stage_memory: tuple[float, ...]
    fits: bool
    host_bound: bool
    breakdown: StepBreakdown
    simulation: Simulation

    @property
    def step_time(self) -> float:
        """Seconds per optimizer step."""
        return self.breakdown.total


#: Schedules are immutable data and a plan asks for the same (kind, K, M) many times: build each once.
_SCHEDULE_CACHE_SIZE = 512
_schedule = functools.lru_cache(maxsize=_SCHEDULE_CACHE_SIZE)(generate)


def transfer_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """One point-to-point message: a fixed latency plus bytes over bandwidth."""
    return latency + nbytes / bandwidth


def ring_allreduce_time(nbytes: float, ranks: int, bandwidth: float, step_latency: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``ranks``: ``2(n-1)/n * bytes / bandwidth + 2(n-1) * step_latency``."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * step_latency


@dataclass(frozen=True, slots=True)
class _Stage:
    gpu_f: float
    gpu_b: float
    host_f: float
    host_b: float
    state: float
    stored: float
    grads: float
    optimizer: float
    out_bytes: float
    active: int


def _stage(entries: Sequence[tuple[SubLayerCost, Mode]], mb: float, cluster: ClusterSpec) -> _Stage:
    gpu = cluster.gpu
    gpu_f = gpu_b = host_f = host_b = state = stored = params = 0.0
    out = 0.0
    active = 0
    for cost, mode in entries:
        if mode is Mode.CACHED:
            continue
        out = cost.output_bytes * mb
        host_f += gpu.host_overhead * cost.host_weight
        if mode is Mode.FROZEN:
            gpu_f += cost.frozen_forward * mb
            state += FROZEN_BYTES_PER_PARAM * cost.params
            continue
        gpu_f += cost.forward * mb
        gpu_b += cost.backward * mb
        host_b += gpu.host_overhead * cost.host_weight
        state += STATE_BYTES_PER_PARAM * cost.params
        stored += cost.stored_bytes * mb
        params += cost.params
        active += 1
    return _Stage(
        gpu_f=gpu_f,
        gpu_b=gpu_b,
        host_f=host_f,
        host_b=host_b,
        state=state,
        stored=stored,
        grads=GRAD_BYTES_PER_PARAM * params,
        optimizer=OPTIMIZER_BYTES_PER_PARAM * params / gpu.memory_bandwidth,
        out_bytes=out,
        active=active,
    )


def _weights(entries: Sequence[tuple[SubLayerCost, Mode]], mb: float, cluster: ClusterSpec) -> list[float]:
    """Per-entry time for the partition solver: the larger of GPU and host work (both add up along a stage)."""
    out = []
    for cost, mode in entries:
        s = _stage([(cost, mode)], mb, cluster)
        out.append(max(s.gpu_f + s.gpu_b, s.host_f + s.host_b))
    return out


def _memory_weights(entries: Sequence[tuple[SubLayerCost, Mode]], mb: float, held: int) -> list[float]:
    """Per-entry peak memory when ``held`` micro-batches are in flight (for a memory-balanced fallback partition)."""
    out = []
    for cost, mode in entries:
        if mode is Mode.ACTIVE:
            out.append(STATE_BYTES_PER_PARAM * cost.params + cost.stored_bytes * mb * held)
        elif mode is Mode.FROZEN:
            out.append(float(FROZEN_BYTES_PER_PARAM * cost.params))
        else:
            out.append(0.0)
    return out


def _split(
    entries: Sequence[tuple[SubLayerCost, Mode]], counts: Sequence[int]
) -> list[list[tuple[SubLayerCost, Mode]]]:
    out, start = [], 0
    for c in counts:
        out.append(list(entries[start : start + c]))
        start += c
    return out


def partition_entries(
    entries: Sequence[tuple[SubLayerCost, Mode]],
    stages: int,
    micro_batch: float,
    cluster: ClusterSpec,
    solver: str = "optimal",
) -> tuple[int, ...]:
    """Time-balanced partition of the non-cached ``entries`` into ``stages`` at a micro-batch size."""
    live = [e for e in entries if e[1] is not Mode.CACHED]
    if len(live) < stages:
        raise PlannerError(f"{stages} stages need at least as many sub-layers, got {len(live)}")
    return solve(_weights(live, micro_batch, cluster), stages, solver).layers_per_stage


def gradient_sync_time(nbytes: float, sublayers: int, replicas: int, bandwidth: float, cluster: ClusterSpec) -> float:
    """Averaging one rank's gradients over ``replicas``: the ring all-reduce of ``nbytes`` plus the sync's fixed
    cost and its per-sub-layer cost for the ``sublayers`` trained sub-layers (none without a second replica or
    without gradients)."""
    if replicas <= 1 or nbytes <= 0:
        return 0.0
    ring = ring_allreduce_time(nbytes, replicas, bandwidth, cluster.collective_latency)
    return ring + cluster.sync_overhead + sublayers * cluster.sync_sublayer_overhead


def _stage_times(
    stages: Sequence[_Stage], cluster: ClusterSpec, pipe_len: int, cache: float
) -> tuple[list[float], list[float], list[float]]:
    fwd = [max(st.gpu_f + (cache if s == 0 else 0.0), st.host_f) for s, st in enumerate(stages)]
    bwd = [max(st.gpu_b, st.host_b) for st in stages]
    inside_node = pipe_len <= cluster.gpus_on_a_node
    link = cluster.intra_node_bandwidth if inside_node else cluster.inter_node_bandwidth
    hops = [transfer_time(st.out_bytes, link, cluster.p2p_latency) for st in stages[:-1]]
    return fwd, bwd, hops


def microbatch_cost(
    entries: Sequence[tuple[SubLayerCost, Mode]],
    layers_per_stage: Sequence[int],
    cluster: ClusterSpec,
    *,
    pipe_len: int,
    cache_seconds_per_sample: float = 0.0,
) -> Callable[[int], StageTimes]:
    """Per-stage times as a function of the micro-batch size, for :func:`elastic_pipe.schedule.tune_microbatches`.

    Args:
        entries: the non-cached sub-layers with their modes, in order.
        layers_per_stage: a partition of ``entries``.
        cluster: the cluster.
        pipe_len: pipeline ranks (the link between stages depends on whether the pipeline spans nodes).
        cache_seconds_per_sample: cache read and fill time per sample on stage 0.
    """
    pieces = _split(entries, layers_per_stage)

    def cost(size: int) -> StageTimes:
        stages = [_stage(piece, size, cluster) for piece in pieces]
        fwd, bwd, hops = _stage_times(stages, cluster, pipe_len, cache_seconds_per_sample * size)
        return StageTimes(forward=tuple(fwd), backward=tuple(bwd), transfer=max(hops, default=0.0))

    return cost


def predict_step(
    entries: Sequence[tuple[SubLayerCost, Mode]],
    cluster: ClusterSpec,
    *,
    global_batch: int,
    pipe_len: int,
    microbatches: int,
    schedule: str = "1f1b",
    chunks: int = 1,
    cache_seconds_per_sample: float = 0.0,
    layers_per_stage: Sequence[int] | None = None,
    solver: str = "optimal",
) -> StepPrediction:
    """Predict one step of the layout ``pipe_len`` x ``cluster.gpus // pipe_len`` replicas.

    Args:
        entries: the sub-layers the pipeline holds, in order, with their mode (cached entries cost nothing; they
            are dropped before partitioning unless ``layers_per_stage`` fixes the partition).
        cluster: the cluster.
        global_batch: samples per optimizer step over all replicas.
        pipe_len: pipeline ranks K (must divide ``cluster.gpus``).
        microbatches: micro-batches per step and replica.
        schedule: a schedule kind of :mod:`elastic_pipe.schedule`.
        chunks: stages per rank (interleaved schedules).
        cache_seconds_per_sample: cache read (and fill write) time per sample, paid on stage 0.
        layers_per_stage: a fixed partition over ``entries`` (``K * chunks`` counts); ``None`` partitions the
            non-cached entries with ``solver`` (balancing time; a memory-balanced partition if that does not fit).
        solver: the partition solver.

    Raises:
        PlannerError: a pipeline length that does not divide the GPUs, more stages than sub-layers, or a batch
            smaller than the micro-batch count.
    """
    for index, entry in enumerate(CHECK.items("entries", entries)):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], SubLayerCost)):
            raise PlannerTypeError(f"entries[{index}] must be a (SubLayerCost, Mode) pair, got {entry!r}")
    CHECK.instance("cluster", cluster, ClusterSpec)
    CHECK.int("global_batch", global_batch, lo=1)
    CHECK.int("pipe_len", pipe_len, lo=1, hi=MAX_PIPE_LEN)
    CHECK.int("microbatches", microbatches, lo=1, hi=MAX_MICROBATCHES)
    CHECK.str("schedule", schedule)
    CHECK.int("chunks", chunks, lo=1)
    CHECK.float("cache_seconds_per_sample", cache_seconds_per_sample)
    if layers_per_stage is not None:
        CHECK.ints("layers_per_stage", layers_per_stage)
    CHECK.str("solver", solver)
    if pipe_len < 1 or cluster.gpus % pipe_len:
        raise PlannerError(f"pipe_len={pipe_len} must divide the {cluster.gpus} GPUs")
    replicas = cluster.gpus // pipe_len
    per_replica = global_batch / replicas
    if microbatches < 1 or per_replica < microbatches:
        raise PlannerError(
            f"{microbatches} micro-batches need at least that many samples per replica, got {per_replica:g}"
        )
    mb = per_replica / microbatches
    stages = pipe_len * chunks
    if layers_per_stage is None:
        live = [e for e in entries if e[1] is not Mode.CACHED]
        candidates = [partition_entries(live, stages, mb, cluster, solver)]
        if stages > 1:
            held = min(stages, microbatches)
            candidates.append(solve(_memory_weights(live, mb, held), stages, solver).layers_per_stage)
        pieces = live
    else:
        if len(layers_per_stage) != stages or sum(layers_per_stage) != len(entries):
            raise PlannerError(
                f"layers_per_stage={tuple(layers_per_stage)} must have {stages} counts summing to {len(entries)}"
            )
        candidates = [tuple(layers_per_stage)]
        pieces = list(entries)
    best: StepPrediction | None = None
    for counts in candidates:
        pred = _predict(
            split=_split(pieces, counts),
            counts=counts,
            cluster=cluster,
            replicas=replicas,
            microbatches=microbatches,
            mb=mb,
            kind=schedule,
            chunks=chunks,
            cache_per_sample=cache_seconds_per_sample,
        )
        if pred.fits or best is None:
            best = pred
        if pred.fits:
            break
    assert best is not None
    return best


def _predict(
    *,
    split: list[list[tuple[SubLayerCost, Mode]]],
    counts: Sequence[int],
    cluster: ClusterSpec,
    replicas: int,
    microbatches: int,
    mb: float,
    kind: str,
    chunks: int,
    cache_per_sample: float,
) -> StepPrediction:
    pipe_len = len(split) // chunks
    stages = [_stage(piece, mb, cluster) for piece in split]
    fwd, bwd, hops = _stage_times(stages, cluster, pipe_len, cache_per_sample * mb)
    cache = [cache_per_sample * mb if s == 0 else 0.0 for s in range(len(stages))]
    sched = _schedule(kind, pipe_len, microbatches, chunks)
    with_links = simulate(sched, fwd, bwd, transfer=hops if hops else 0.0)
    no_links = simulate(sched, fwd, bwd) if hops else with_links
    per_rank = [0.0] * pipe_len
    for s, (f, b) in enumerate(zip(fwd, bwd, strict=True)):
        per_rank[s % pipe_len] += microbatches * (f + b)
    busiest = max(range(pipe_len), key=per_rank.__getitem__)
    cache_part = microbatches * cache[0] if busiest == 0 else 0.0
    compute = per_rank[busiest] - cache_part
    bubble = max(0.0, no_links.makespan - per_rank[busiest])
    transfers = max(0.0, with_links.makespan - no_links.makespan)
    spans_nodes = cluster.gpus > cluster.gpus_on_a_node
    dp_link = cluster.inter_node_bandwidth if spans_nodes else cluster.intra_node_bandwidth
    rank_grads = [0.0] * pipe_len
    rank_opt = [0.0] * pipe_len
    rank_mem = [0.0] * pipe_len
    for s, st in enumerate(stages):
        r = s % pipe_len
        rank_grads[r] += st.grads
        rank_opt[r] += st.optimizer
        rank_mem[r] += st.state + st.stored * with_links.peak_activations[s]
    rank_active = [0] * pipe_len
    for s, st in enumerate(stages):
        rank_active[s % pipe_len] += st.active
    allreduce = max(
        gradient_sync_time(g, n, replicas, dp_link, cluster) for g, n in zip(rank_grads, rank_active, strict=True)
    )
    optimizer = max(
        t + cluster.gpu.optimizer_overhead + n * cluster.gpu.optimizer_sublayer_overhead
        for t, n in zip(rank_opt, rank_active, strict=True)
    )
    host = sum(stages[s].host_f + stages[s].host_b for s in range(busiest, len(stages), pipe_len))
    gpu = sum(stages[s].gpu_f + stages[s].gpu_b for s in range(busiest, len(stages), pipe_len))
    return StepPrediction(
        pipe_len=pipe_len,
        replicas=replicas,
        chunks=chunks,
        microbatches=microbatches,
        micro_batch=mb,
        layers_per_stage=tuple(counts),
        stage_memory=tuple(rank_mem),
        fits=all(m <= cluster.gpu.usable_memory for m in rank_mem),
        host_bound=host > gpu,
        breakdown=StepBreakdown(
            compute=compute,
            bubble=bubble,
            transfers=transfers,
            cache_reads=cache_part,
            allreduce=allreduce,
            optimizer=optimizer,
            host=cluster.gpu.data_overhead + cluster.gpu.pass_overhead,
        ),
        simulation=with_links,
    )
