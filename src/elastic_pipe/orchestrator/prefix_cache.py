"""The frozen prefix's activation cache on a stage-0 rank: carried to a new boundary, judged, filled.

The training split is read by position ranges (``data.input_rows(start, stop)``): a slice of tensors in memory, or
items of a dataset read in this process (:class:`~elastic_pipe.orchestrator.step_data.DatasetSplit`); the entries
are keyed by ``data.sample_ids``. A dataset's transforms run once per fill, so a random one would be frozen into
the cache: such a dataset needs ``[pipeline] cache = "off"``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elastic_pipe import cache as acache
from elastic_pipe.orchestrator.step_data import StepData

__all__ = ["FillPeers", "fill_cache", "fill_shared", "prepare_cache"]

log = logging.getLogger(__name__)

#: torch 2.13 renamed ``all_gather_into_tensor`` (now deprecated) to ``all_gather_single``; 2.11 has only the former.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: Runs sub-layers ``lo:hi`` on a batch (``run(x, lo, hi)``), under ``no_grad``.
RunSublayers = Callable[[torch.Tensor, int, int], torch.Tensor]


@dataclass(frozen=True)
class FillPeers:
    """The stage-0 ranks of every replica, which share one pass over the training split.

    Each computes every ``count``-th chunk of the prefix outputs and an all-gather in ``group`` hands every
    peer the rest, so the pass costs ``1/count`` of the compute it would cost each rank alone.

    Attributes:
        group: the process group of the peers (the stage-0 data-parallel group).
        index: this rank's position in ``group``.
        count: the number of peers.
    """

    group: Any
    index: int
    count: int


def prepare_cache(
    cache: acache.ActivationCache,
    data: StepData,
    *,
    mode: str,
    old_frozen: int,
    frozen: int,
    per_replica: int,
    chunk: int,
    device: torch.device,
    run: RunSublayers,
    peers: FillPeers | None = None,
    example: torch.Tensor | None = None,
) -> tuple[bool, str]:
    """Carry cached entries from ``old_frozen`` to ``frozen``, decide whether reading pays, fill when it does.

    Args:
        cache: the rank's activation cache.
        data: the training split.
        mode: ``"on"`` (always read) or ``"auto"`` (read when :func:`elastic_pipe.cache.measure_payoff` says so).
        old_frozen: the boundary before the transition (0: none).
        frozen: the new boundary (number of frozen sub-layers, > 0).
        per_replica: samples per replica per step (the payoff is measured on one such batch).
        chunk: samples per prefix forward when filling.
        device: where the inputs go.
        run: runs a range of sub-layers.
        peers: when several replicas' stage-0 ranks call this together (a collective in ``peers.group``), they
            split the carrying and filling between them and all-gather the results; the new boundary takes over
            the old one's memory. ``None``: this rank does it all alone.
        example: the prefix's output at ``frozen`` for one sample, if the caller has it (the shared fill needs
            the entry's shape and dtype, and otherwise runs the whole prefix once to learn them).

    Returns:
        Whether stage 0 reads the cache, and why (the same answer on every peer).
    """
    if peers is not None and peers.count > 1:
        enabled, reason = _decide(
            cache, data, mode=mode, frozen=frozen, per_replica=per_replica, device=device, run=run
        )
        agreed = _agree(enabled, peers, device)
        if agreed:
            fill_shared(
                cache, data, old_frozen, frozen, chunk=chunk, device=device, run=run, peers=peers, example=example
            )
            return True, reason
        if old_frozen and old_frozen != frozen:
            cache.drop(old_frozen)
        return False, reason if not enabled else f"{reason}, but not on another replica's stage 0: off on all"
    if old_frozen and old_frozen != frozen and old_frozen in cache.boundaries():
        # Only the newly frozen sub-layers run on the cached entries; then the old boundary is dropped.
        cache.extend(old_frozen, frozen, lambda v: run(v, old_frozen, frozen))
        cache.drop(old_frozen)
    enabled, reason = _decide(cache, data, mode=mode, frozen=frozen, per_replica=per_replica, device=device, run=run)
    if enabled:
        # Every rank may be handed any sample in a later epoch, so the whole training split is cached.
        fill_cache(cache, data, frozen, chunk=chunk, device=device, run_prefix=lambda v: run(v, 0, frozen))
    return enabled, reason


def _decide(
    cache: acache.ActivationCache,
    data: StepData,
    *,
    mode: str,
    frozen: int,
    per_replica: int,
    device: torch.device,
    run: RunSublayers,
) -> tuple[bool, str]:
    if mode == "on":
        return True, "cache = 'on'"
    decision = acache.measure_payoff(
        cache,
        data.sample_ids[:per_replica],
        frozen,
        data.input_rows(0, per_replica).to(device),
        lambda v: run(v, 0, frozen),
    )
    return decision.enabled, decision.reason


def _agree(enabled: bool, peers: FillPeers, device: torch.device) -> bool:
    """Every peer reads the cache only if all of them would (the shared fill is a collective)."""
    flag = torch.tensor([1.0 if enabled else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=peers.group)
    return bool(flag.item() > 0)


def fill_shared(
    cache: acache.ActivationCache,
    data: StepData,
    old_frozen: int,
    frozen: int,
    *,
    chunk: int,
    device: torch.device,
    run: RunSublayers,
    peers: FillPeers,
    example: torch.Tensor | None = None,
    overlap: bool = True,
) -> None:
    """Cache the prefix output at ``frozen`` for the whole training split, the work split between ``peers``.

    The split's chunks are dealt round-robin: in each round every peer computes one chunk, then one all-gather
    gives every peer all of the round's rows. Before the rounds, each peer carries its own chunks' entries at
    ``old_frozen`` to ``frozen`` in place (running only sub-layers ``old_frozen:frozen``,
    :meth:`~elastic_pipe.cache.ActivationCache.extend` with ``only``); the other entries' slots stay reserved for
    the rows the all-gather brings, so the new boundary reuses the old one's memory instead of fitting into
    what the old one leaves of the budget. Samples not cached at ``old_frozen`` run the whole prefix from their
    inputs. ``example``, the output at ``frozen`` for one sample, gives the entries' shape and dtype
    (``None``: the prefix runs on one sample to learn them). ``overlap``: each round's all-gather runs while the
    next round computes (``False``: one after the other). A collective: every peer calls it with the same
    arguments.
    """
    # Ids stay on the host, where the cache's bookkeeping is: the loop never waits for the device, so each
    # round's compute, all-gather and store queue up behind the last.
    ids_all, n = data.sample_ids.to("cpu", torch.int64), int(data.sample_ids.shape[0])
    if n == 0:
        return
    starts = list(range(0, n, chunk))
    probe = example if example is not None else run(data.input_rows(0, 1).to(device), 0, frozen)  # shape and dtype
    if old_frozen and old_frozen != frozen:
        # extend is node-wide for node-shared tiers: every peer lets go of the old files before the leader renames.
        # Every peer meets both barriers, also one that holds nothing at the old boundary (it was not stage 0 in
        # the old layout), which then fills its chunks from the inputs.
        dist.barrier(group=peers.group)
        if old_frozen in cache.boundaries():
            mine_ids = torch.cat(
                [ids_all[starts[c] : starts[c] + chunk] for c in range(peers.index, len(starts), peers.count)]
            )
            cache.extend(old_frozen, frozen, lambda v: run(v, old_frozen, frozen), only=mine_ids)
        dist.barrier(group=peers.group)
    rejected = cache.stats.rejected
    shape = (chunk, *probe.shape[1:])
    # Two sets of buffers, used in turn: round r's all-gather runs while round r+1 computes, and is waited for
    # (then stored) only after that compute is queued. The stream orders each buffer's reuse two rounds later.
    mine = [torch.zeros(shape, dtype=probe.dtype, device=device) for _ in range(2)]
    gathered = [torch.empty((peers.count * chunk, *shape[1:]), dtype=probe.dtype, device=device) for _ in range(2)]
    in_flight: tuple[Any, torch.Tensor, int] | None = None  # (all-gather, its output, first row of its round)

    def store(flight: tuple[Any, torch.Tensor, int]) -> None:
        work, rows, lo = flight
        work.wait()
        valid = min(n - lo, peers.count * chunk)
        cache.put(ids_all[lo : lo + valid], frozen, rows[:valid])

    for r, first in enumerate(range(0, len(starts), peers.count)):
        buf = r % 2
        if first + peers.index < len(starts):
            lo = starts[first + peers.index]
            rows = _prefix_rows(
                cache,
                ids_all[lo : lo + chunk],
                functools.partial(data.input_rows, lo, lo + chunk),
                frozen=frozen,
                run=run,
                device=device,
            )
            mine[buf][: rows.shape[0]] = rows
        # Peer p's chunk lands at rows p*chunk: the round's samples, in order (only the split's last chunk
        # is short, and it is the round's last valid one).
        work = _all_gather_into(gathered[buf], mine[buf], group=peers.group, async_op=True)
        if in_flight is not None:
            store(in_flight)
        in_flight = (work, gathered[buf], starts[first])
        if not overlap:
            store(in_flight)
            in_flight = None
    if in_flight is not None:
        store(in_flight)
    if cache.stats.rejected > rejected:
        log.warning(
            "activation cache full: %d of %d samples not cached at boundary %d; raise cache_mb to cache them all",
            cache.stats.rejected - rejected,
            n,
            frozen,
        )


def _prefix_rows(
    cache: acache.ActivationCache,
    ids: torch.Tensor,
    read: Callable[[], torch.Tensor],
    *,
    frozen: int,
    run: RunSublayers,
    device: torch.device,
) -> torch.Tensor:
    """Prefix outputs at ``frozen`` for one chunk: the cached entries where present (carried there by ``extend``),
    the whole prefix on the inputs (``read()``, read only then) for the rest."""
    with cache.uncounted():
        lookup = cache.get(ids, frozen)
    if lookup.num_hits == ids.shape[0]:  # the usual case after a carry: no compute, no scatter, no read
        return lookup.values
    inputs = read()
    computed = run(inputs[(~lookup.hit).to(inputs.device)].to(device), 0, frozen)
    if lookup.num_hits == 0:
        return computed
    return lookup.merge(computed.to(lookup.values.dtype))


def fill_cache(
    cache: acache.ActivationCache,
    data: StepData,
    frozen: int,
    *,
    chunk: int,
    device: torch.device,
    run_prefix: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Store the frozen prefix's output for every training sample this rank may be handed.

    The sampler reshuffles and re-shards every epoch, so a rank sees a different part of the data each
    epoch: a cache filled only by the samples a rank happened to train on would hit about 1/replicas of the
    time, and the ranks that miss would hold up the others at every gradient sync. One pass of the frozen
    prefix over the training set (only the misses run; entries carried over by ``extend`` are reused) makes
    every later read a hit, for the price of about one epoch of frozen-prefix forwards. It stops early,
    with a warning, when the cache's budgets are full.

    Args:
        cache: the rank's activation cache.
        data: the training split.
        frozen: the boundary (number of frozen sub-layers) the entries are stored under.
        chunk: samples per prefix forward.
        device: where the inputs go.
        run_prefix: runs the frozen prefix on a batch of inputs.
    """
    ids_all = data.sample_ids
    rejected = cache.stats.rejected
    for start in range(0, int(ids_all.shape[0]), chunk):
        ids = ids_all[start : start + chunk]
        inputs = data.input_rows(start, start + chunk).to(device)
        cache.get_or_compute(ids, frozen, inputs, run_prefix)
        if cache.stats.rejected > rejected:
            log.warning(
                "activation cache full after %d of %d samples at boundary %d; raise cache_mb to cache them all",
                start,
                int(ids_all.shape[0]),
                frozen,
            )
            break
