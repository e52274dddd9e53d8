"""The frozen prefix's activation cache on a stage-0 rank: carried to a new boundary, judged and filled (building
it from ``[pipeline]``: :mod:`~elastic_pipe.orchestrator.prefix.build`; reading it during an epoch:
:mod:`~elastic_pipe.orchestrator.prefix.reads`).

The training split is read by position ranges (``data.input_rows(start, stop)``): a slice of tensors in memory, or
items of a dataset read in this process (:class:`~elastic_pipe.orchestrator.step_data.DatasetSplit`); the entries
are keyed by ``data.sample_ids``. A dataset that declares random transforms (``random_augmentation = True``) is
served by ``[pipeline] cache_policy``: ``bypass`` builds the cache disabled (the prefix is recomputed from each
step's augmented input), ``views`` fills ``views`` draws of the transforms per sample and epoch ``e`` reads draw
``e % views``.

With ``[pipeline] cache_dtype`` narrower than the prefix output, the entries are stored (and all-gathered and
broadcast between peers) in the narrower dtype; sub-layers that run on cached entries take them widened back
(:func:`widening`).
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
from elastic_pipe.orchestrator.prefix.reads import covers
from elastic_pipe.orchestrator.step_data import StepData

__all__: list[str] = []  # internal: the package face exports what others use

#: Why stage 0 does not read a cache that bypasses itself.
BYPASS_REASON = "bypass: the dataset's transforms are random ([pipeline] cache_policy = 'bypass')"

log = logging.getLogger(__name__)

#: torch 2.13 renamed ``all_gather_into_tensor`` (now deprecated) to ``all_gather_single``; 2.11 has only the former.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: Runs sub-layers ``lo:hi`` on a batch (``run(x, lo, hi)``), under ``no_grad``.
RunSublayers = Callable[[torch.Tensor, int, int], torch.Tensor]


def widening(run: RunSublayers, dtype_at: Callable[[int], torch.dtype]) -> RunSublayers:
    """``run`` with its input cast to ``dtype_at(lo)`` first when it starts past the model's input (``lo > 0``).

    Sub-layers that carry cached entries to a new boundary (:meth:`~elastic_pipe.cache.ActivationCache.extend`)
    get them as stored, which ``[pipeline] cache_dtype`` may make narrower than the prefix output they expect
    (``dtype_at(lo)``: the dtype of the activation entering sub-layer ``lo``); a cast to the same dtype is free.
    """

    def run_widened(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        return run(x.to(dtype_at(lo)) if lo > 0 else x, lo, hi)

    return run_widened


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
    fill: bool = True,
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
        fill: ``False``: a rank alone (no ``peers``) that reads the cache does not fill it here; the steps store
            what they miss (the caller's choice, when a pass over the split would cost more than it saves).

    Returns:
        Whether stage 0 reads the cache, and why (the same answer on every peer).

    A cache that bypasses itself (random transforms, ``cache_policy = "bypass"``) is never read or filled. With
    per-epoch views every view is filled (each a fresh read of the dataset, so a fresh draw of its transforms).
    """
    if not cache.enabled:
        return False, BYPASS_REASON
    views = cache.config.views_per_sample
    if peers is not None and peers.count > 1:
        enabled, reason = _decide(
            cache, data, mode=mode, frozen=frozen, per_replica=per_replica, device=device, run=run, old=old_frozen
        )
        agreed = _agree(enabled, peers, device)
        if agreed:
            for view in range(views):
                cache.set_epoch(view)
                carried = old_frozen if view == 0 else frozen  # the first pass carries every view's entries
                fill_shared(
                    cache, data, carried, frozen, chunk=chunk, device=device, run=run, peers=peers, example=example
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
    if enabled and not fill:
        return True, f"{reason}; filled by the steps as they miss"
    if enabled:
        # Every rank may be handed any sample in a later epoch, so the whole training split is cached.
        for view in range(views):
            cache.set_epoch(view)
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
    old: int = 0,
) -> tuple[bool, str]:
    """``"on"``, or the measured answer for the whole fill, each tier weighed by the entries it would hold
    (:func:`elastic_pipe.cache.measure_tiered_payoff`); ``old``: a boundary whose space the fill will reuse."""
    if mode == "on":
        return True, "cache = 'on'"
    reused = old if old and old != frozen and old in cache.boundaries() else frozen
    decision = acache.measure_tiered_payoff(
        cache,
        data.input_rows(0, per_replica).to(device),
        reused,
        lambda v: run(v, 0, frozen),
        samples=len(data),
    )
    return decision.enabled, decision.reason


def _all_peers(flag: bool, peers: FillPeers, device: torch.device) -> bool:
    """Whether ``flag`` holds on every peer (one all-reduce in ``peers.group``)."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=peers.group)
    return bool(t.item() > 0)


def _peer_zero(flag: bool, peers: FillPeers, device: torch.device) -> bool:
    """Peer 0's ``flag``, on every peer (one broadcast in ``peers.group``)."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(t, src=dist.get_global_rank(peers.group, 0), group=peers.group)
    return bool(t.item() > 0)


def send_from_peer_zero(
    cache: acache.ActivationCache,
    ids_all: torch.Tensor,
    frozen: int,
    example: torch.Tensor,
    *,
    chunk: int,
    device: torch.device,
    peers: FillPeers,
) -> None:
    """Peer 0, which holds every entry of ``ids_all`` at ``frozen`` (the current view), sends them chunk by chunk
    to the other peers, which store those they lack (a collective in ``peers.group``; nothing runs a sub-layer).

    Args:
        example: the prefix output at ``frozen`` for one sample: the entries' shape; they travel in the dtype
            they are stored in.
    """
    src = dist.get_global_rank(peers.group, 0)
    shape, dtype = tuple(example.shape[1:]), cache.stored_dtype(example.dtype)
    for lo in range(0, int(ids_all.shape[0]), chunk):
        ids = ids_all[lo : lo + chunk]
        if peers.index == 0:
            with cache.uncounted():
                rows = cache.get(ids, frozen).values.to(device, dtype)
        else:
            rows = torch.empty((ids.shape[0], *shape), dtype=dtype, device=device)
        dist.broadcast(rows, src=src, group=peers.group)
        if peers.index != 0:
            cache.put(ids, frozen, rows)  # ids already cached here (node-shared files) are skipped


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
        # the old layout).
        dist.barrier(group=peers.group)
        holds = old_frozen in cache.boundaries()
        # Peers split the carry when each holds its own copy of every entry; where a peer lacks them (it was not
        # stage 0 before), or a node-shared tier holds them (the leader rewrites those files for every sample),
        # each holder carries all it holds, and the peers that still lack entries get them from peer 0 below.
        split = _all_peers(holds and not cache.shares(old_frozen), peers, device)
        if holds:
            mine_ids = None
            if split:
                mine_ids = torch.cat(
                    [ids_all[starts[c] : starts[c] + chunk] for c in range(peers.index, len(starts), peers.count)]
                )
            cache.extend(old_frozen, frozen, lambda v: run(v, old_frozen, frozen), only=mine_ids)
        dist.barrier(group=peers.group)
        if not split:
            covered = bool(cache.cached(ids_all, frozen).all())
            if _all_peers(covered, peers, device):
                return  # every peer holds every entry: nothing to compute or send
            if _peer_zero(covered, peers, device):
                send_from_peer_zero(cache, ids_all, frozen, probe, chunk=chunk, device=device, peers=peers)
                return
    rejected = cache.stats.rejected
    shape, dtype = (chunk, *probe.shape[1:]), cache.stored_dtype(probe.dtype)  # the rows travel as they are stored
    # Two sets of buffers, used in turn: round r's all-gather runs while round r+1 computes, and is waited for
    # (then stored) only after that compute is queued. The stream orders each buffer's reuse two rounds later.
    mine = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2)]
    gathered = [torch.empty((peers.count * chunk, *shape[1:]), dtype=dtype, device=device) for _ in range(2)]
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
            mine[buf][: rows.shape[0]] = rows  # cast to the stored dtype as a put would
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
            "activation cache full: %d of %d samples not cached at boundary %d; raise the budgets to cache all",
            cache.stats.rejected - rejected,
            n,
            frozen,
        )


def carry_released(
    cache: acache.ActivationCache,
    data: StepData,
    old_frozen: int,
    frozen: int,
    *,
    chunk: int,
    device: torch.device,
    run: RunSublayers,
    example: torch.Tensor,
    peers: FillPeers | None = None,
) -> bool:
    """Bring the cache to ``frozen`` without the released prefix: only sub-layers ``old_frozen:frozen`` run.

    Every peer that holds entries at ``old_frozen`` carries all of them (every view) through the newly frozen
    sub-layers (:meth:`~elastic_pipe.cache.ActivationCache.extend`; every new stage-0 rank holds those), so
    nothing runs sub-layers ``0:old_frozen``. The peers that lack entries (they were not stage 0 before) then
    get them from peer 0 (rank 0, which held every entry at ``old_frozen``): it reads its entries chunk by chunk
    and broadcasts them in ``peers.group``. A collective in ``peers.group``: every peer calls it with the same
    arguments.

    Args:
        example: the prefix output at ``frozen`` for one sample (the broadcast rows' shape; their dtype is the
            one the entries are stored in).

    Returns:
        Whether every peer's cache now holds every training sample (every view) at ``frozen``, the same answer
        on every peer; ``False`` leaves entries missing, and the caller brings the prefix back to fill them.
    """
    shared = peers is not None and peers.count > 1
    if shared:
        assert peers is not None
        dist.barrier(group=peers.group)  # extend is node-wide for node-shared tiers (see fill_shared)
    if old_frozen != frozen and old_frozen in cache.boundaries():
        cache.extend(old_frozen, frozen, lambda v: run(v, old_frozen, frozen))
    if not shared:
        return covers(cache, data, frozen)
    assert peers is not None
    dist.barrier(group=peers.group)
    mine = covers(cache, data, frozen)
    whole = _peer_zero(mine, peers, device)  # does peer 0 hold them all?
    lacking = not _all_peers(mine, peers, device)  # does any peer lack some?
    if not whole:
        return False
    if lacking:
        ids_all = data.sample_ids.to("cpu", torch.int64)
        for view in range(cache.config.views_per_sample):
            cache.set_epoch(view)
            send_from_peer_zero(cache, ids_all, frozen, example, chunk=chunk, device=device, peers=peers)
        cache.set_epoch(0)
    done = torch.tensor([1.0 if covers(cache, data, frozen) else 0.0], device=device)
    dist.all_reduce(done, op=dist.ReduceOp.MIN, group=peers.group)
    return bool(done.item() > 0)


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
    the whole prefix on the inputs (``read()``, read only then) for the rest; mixed, in the stored dtype."""
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
    prefix over the training set makes every later read a hit, for the price of about one epoch of
    frozen-prefix forwards. Only the samples without an entry are read and run (entries carried over by
    ``extend`` are reused), in chunks read through ``data.batches``: a dataset's ``DataLoader`` workers decode
    them while the prefix runs. It stops early, with a warning, when the cache's budgets are full.

    Args:
        cache: the rank's activation cache.
        data: the training split.
        frozen: the boundary (number of frozen sub-layers) the entries are stored under.
        chunk: samples per prefix forward.
        device: where the inputs go.
        run_prefix: runs the frozen prefix on a batch of inputs.
    """
    ids_all = data.sample_ids.to("cpu", torch.int64)
    todo = (~cache.cached(ids_all, frozen)).nonzero().flatten().tolist()
    lists = [todo[start : start + chunk] for start in range(0, len(todo), chunk)]
    rejected = cache.stats.rejected
    batches = data.batches(lists, inputs=True, labels=False, device=device)
    for done, (positions, inputs, _) in enumerate(batches):
        assert inputs is not None
        with torch.no_grad():
            cache.put(ids_all[positions], frozen, run_prefix(inputs))
        if cache.stats.rejected > rejected:
            log.warning(
                "activation cache full after %d of %d samples at boundary %d; raise the budgets to cache all",
                int(ids_all.shape[0]) - len(todo) + done * chunk,
                int(ids_all.shape[0]),
                frozen,
            )
            break
    close = getattr(batches, "close", None)
    if close is not None:  # a loader stopped early: let its workers go
        close()
