"""The activation cache filled and carried by several replicas' stage-0 ranks together (:class:`.carry.FillPeers`):
the training split's chunks dealt round-robin and all-gathered (:func:`fill_shared`), the entries of peer 0 sent
to the peers that lack them (:func:`send_from_peer_zero`), and the carry with the prefix released
(:func:`carry_released`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe.orchestrator.prefix.carry import CacheJob, FillPeers, RunSublayers
from elastic_pipe.orchestrator.prefix.reads import covers

if TYPE_CHECKING:
    from elastic_pipe import cache as acache

__all__: list[str] = []  # internal: the package face exports what others use

log = logging.getLogger(__name__)

#: torch 2.13 renamed ``all_gather_into_tensor`` (now deprecated) to ``all_gather_single``; 2.11 has only the former.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_peers(flag: bool, peers: FillPeers, device: torch.device) -> bool:
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


def fill_shared(job: CacheJob, peers: FillPeers, *, overlap: bool = True) -> None:
    """Cache the prefix output at ``frozen`` for the whole training split, the work split between ``peers``.

    The split's chunks (``job.chunk`` samples each) are dealt round-robin: in each round every peer computes one
    chunk, then one all-gather gives every peer all of the round's rows. Before the rounds, each peer carries its
    own chunks' entries at ``job.old_frozen`` to ``job.frozen`` in place (running only the newly frozen
    sub-layers, :meth:`~elastic_pipe.cache.ActivationCache.extend` with ``only``); the other entries' slots stay
    reserved for the rows the all-gather brings, so the new boundary reuses the old one's memory instead of
    fitting into what the old one leaves of the budget. Samples not cached at ``old_frozen`` run the whole prefix
    from their inputs. The entries' shape and dtype come from :meth:`~.carry.CacheJob.shape_example`.
    ``overlap``: each round's all-gather runs while the next round computes (``False``: one after the other).
    A collective: every peer calls it with the same arguments.
    """
    cache, data, frozen, chunk, device = job.cache, job.data, job.frozen, job.chunk, job.device
    # Ids stay on the host, where the cache's bookkeeping is: the loop never waits for the device, so each
    # round's compute, all-gather and store queue up behind the last.
    ids_all, n = data.sample_ids.to("cpu", torch.int64), int(data.sample_ids.shape[0])
    if n == 0:
        return
    starts = list(range(0, n, chunk))
    probe = job.shape_example()
    old_frozen = job.old_frozen
    if old_frozen and old_frozen != frozen:
        holds = old_frozen in cache.boundaries()
        # Peers split the carry when each holds its own copy of every entry; where a peer lacks them (it was not
        # stage 0 before), or a node-shared tier holds them (the leader rewrites those files for every sample),
        # each holder carries all it holds, and the peers that still lack entries get them from peer 0 below.
        split = all_peers(holds and not cache.shares(old_frozen), peers, device)
        mine_ids = None
        if split:
            mine_ids = torch.cat(
                [ids_all[starts[c] : starts[c] + chunk] for c in range(peers.index, len(starts), peers.count)]
            )
        job.carry(peers, only=mine_ids)
        if not split:
            covered = bool(cache.cached(ids_all, frozen).all())
            if all_peers(covered, peers, device):
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
    in_flight: tuple[dist.Work, torch.Tensor, int] | None = None  # (all-gather, its output, first row of its round)

    def store(flight: tuple[dist.Work, torch.Tensor, int]) -> None:
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
                run=job.run,
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


def carry_released(job: CacheJob, peers: FillPeers | None = None) -> bool:
    """Bring the cache to ``frozen`` without the released prefix: only sub-layers ``old_frozen:frozen`` run.

    Every peer that holds entries at ``old_frozen`` carries all of them (every view) through the newly frozen
    sub-layers (:meth:`~elastic_pipe.cache.ActivationCache.extend`; every new stage-0 rank holds those), so
    nothing runs sub-layers ``0:old_frozen``. The peers that lack entries (they were not stage 0 before) then
    get them from peer 0 (rank 0, which held every entry at ``old_frozen``): it reads its entries chunk by chunk
    and broadcasts them in ``peers.group``. A collective in ``peers.group``: every peer calls it with the same
    arguments.

    The broadcast rows take :meth:`~.carry.CacheJob.shape_example`'s shape and the dtype the entries are stored in.

    Returns:
        Whether every peer's cache now holds every training sample (every view) at ``frozen``, the same answer
        on every peer; ``False`` leaves entries missing, and the caller brings the prefix back to fill them.
    """
    cache, data, frozen, device = job.cache, job.data, job.frozen, job.device
    job.carry(peers)
    if peers is None or peers.count == 1:
        return covers(cache, data, frozen)
    mine = covers(cache, data, frozen)
    whole = _peer_zero(mine, peers, device)  # does peer 0 hold them all?
    lacking = not all_peers(mine, peers, device)  # does any peer lack some?
    if not whole:
        return False
    if lacking:
        ids_all = data.sample_ids.to("cpu", torch.int64)
        for view in range(cache.config.views_per_sample):
            cache.set_epoch(view)
            example = job.shape_example()
            send_from_peer_zero(cache, ids_all, frozen, example, chunk=job.chunk, device=device, peers=peers)
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
