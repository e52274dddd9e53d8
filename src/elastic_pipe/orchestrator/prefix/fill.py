"""The frozen prefix's activation cache on a stage-0 rank: carried to a new boundary, judged and filled (building
it from ``[pipeline]``: :mod:`~elastic_pipe.orchestrator.prefix.build`; the carry: :mod:`.carry`; filled by several
replicas together: :mod:`.shared`; reading it during an epoch: :mod:`~elastic_pipe.orchestrator.prefix.reads`).

The training split is read by position ranges (``data.input_rows(start, stop)``): a slice of tensors in memory, or
items of a dataset read in this process (:class:`~elastic_pipe.orchestrator.data.DatasetSplit`); the entries
are keyed by ``data.sample_ids``. A dataset that declares random transforms (``random_augmentation = True``) is
served by ``[pipeline] cache_policy``: ``bypass`` builds the cache disabled (the prefix is recomputed from each
step's augmented input), ``views`` fills ``views`` draws of the transforms per sample and epoch ``e`` reads draw
``e % views``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from elastic_pipe import cache as acache
from elastic_pipe.orchestrator.prefix.carry import CacheJob, FillPeers
from elastic_pipe.orchestrator.prefix.shared import all_peers, fill_shared

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.data import StepData

__all__: list[str] = []  # internal: the package face exports what others use

#: Why stage 0 does not read a cache that bypasses itself.
BYPASS_REASON = "bypass: the dataset's transforms are random ([pipeline] cache_policy = 'bypass')"

log = logging.getLogger(__name__)

#: A boundary's entries as a payoff measure weighs them: one sample's shape, the dtype, entries per tier.
Entries = tuple[tuple[int, ...], torch.dtype, dict[str, int]]


def stored_as(cache: acache.ActivationCache, example: torch.Tensor) -> str:
    """What a cache reason adds when ``[pipeline] cache_dtype`` stores the entries narrower than the prefix outputs
    (``example``: one sample's; the entries' bytes are the stored dtype's), ``""`` when they are stored as they are."""
    stored = cache.stored_dtype(example.dtype)
    if stored == example.dtype:
        return ""
    name, entry = str(stored).removeprefix("torch."), example[0].numel() * stored.itemsize
    return f"; entries stored as {name} ({entry} bytes each), read as {str(example.dtype).removeprefix('torch.')}"


def pass_idle(epochs_left: float | None, views: int) -> str:
    """Why a first fill by a pass over the training split would not pay (``""``: it may, or ``epochs_left`` is not
    known): the pass runs the prefix on every sample's ``views`` views, and the rest of the run reads
    ``epochs_left`` epochs of entries, each once. When that is no more than the pass fills, reading saves no more
    prefix forwards than the pass costs, and the pass reads every input once more; the steps run the prefix
    themselves instead (on ViT-B/16 and digits at 224 px, two views, a pass 80% into the run took 1.3 s and saved
    less: the run ended 0.5 s after the one that froze nothing)."""
    if epochs_left is None or epochs_left > views:
        return ""
    return f"off: {epochs_left:.2f} epochs left read no more entries than a pass over the split fills ({views} each)"


def in_steps(cache: acache.ActivationCache, frozen: int, example: torch.Tensor, samples: int) -> bool:
    """Whether a layout's steps may store the frozen prefix's outputs they compute (``example``: one sample's, at
    the boundary ``frozen``; ``samples``: the training split's): those they compute anyway when the cache is not
    read at this boundary (reading did not pay, ``cache = "auto"``), or, for a rank alone with ``"auto"``, a first
    fill by the steps' misses instead of a pass over the split.

    A later transition then carries them through the newly frozen sub-layers only
    (:meth:`~elastic_pipe.cache.ActivationCache.extend`) and its fill reads and runs only what is still
    missing, instead of a pass over the whole training split through the loader (on one H200, ViT-B/16 and
    47,500 images from a file: the pass took 39 s and the epoch after it 11 s; filled by its steps, that epoch
    took 36 s). Only where every entry fits in the device and host tiers (so no put is ever refused; a disk
    write checksums every row, on the host) and with one view per sample.
    """
    if cache.config.views_per_sample != 1:
        return False
    spread = cache.placement(frozen, tuple(example.shape[1:]), example.dtype, samples)
    return spread.get("disk", 0) == 0 and spread["none"] == 0


@dataclass
class ReadsPaid:
    """What one run's ``cache = "auto"`` measured last, so that a deeper boundary need not measure again.

    Measuring runs the prefix on a batch seven times (once for the shapes, a warm-up and five timed runs) and
    times a read from every tier (:func:`elastic_pipe.cache.measure_tiered_payoff`): on MiniLM and BBC News, 55
    steps an epoch, as many prefix forwards as an eighth of an epoch's, at every transition. Once reading paid at
    boundary ``b``, it pays at any deeper boundary whose entries have the same shape and dtype and would spread
    over the tiers alike: each read fetches the same bytes from the same tiers, and the prefix it replaces runs
    more sub-layers on the same inputs. Such a boundary is decided without running anything; any other (a
    shallower one, other entries, other tiers, or after a measure that said no) is measured. One per
    :class:`~elastic_pipe.orchestrator.prefix.FrozenPrefix`; not kept in checkpoints (a resumed run measures
    once more).

    Attributes:
        boundary: where reading last measured as paying (0: never, or the last measure said no).
        entries: the shape, dtype and tier spread of that boundary's entries.
        reason: that measure's reason.
        measured: how many times this run measured (each a prefix-and-read timing).
    """

    boundary: int = 0
    entries: Entries | None = None
    reason: str = ""
    measured: int = 0

    def known(self, frozen: int, entries: Entries) -> str:
        """Why reading pays at ``frozen`` without a measure (``""``: it must be measured)."""
        if not self.boundary or frozen <= self.boundary or entries != self.entries:
            return ""
        return f"paid at boundary {self.boundary}, entries alike, fewer sub-layers recomputed there ({self.reason})"

    def record(self, frozen: int, entries: Entries, decision: acache.CacheDecision) -> None:
        """Keep a measure's answer (``decision``: its :class:`~elastic_pipe.cache.CacheDecision`)."""
        self.measured += 1
        paid = decision.enabled
        self.boundary, self.entries, self.reason = (frozen, entries, decision.reason) if paid else (0, None, "")


def prepare_cache(
    job: CacheJob,
    *,
    mode: str,
    per_replica: int,
    paid: ReadsPaid | None = None,
    peers: FillPeers | None = None,
    fill: bool = True,
) -> tuple[bool, str]:
    """Carry cached entries from ``job.old_frozen`` to ``job.frozen``, decide whether reading pays, fill when it does.

    Args:
        job: the cache, the training split, the boundaries and the sub-layers' runner (``job.frozen > 0``).
        mode: ``"on"`` (always read) or ``"auto"`` (read when :func:`elastic_pipe.cache.measure_payoff` says so).
        per_replica: samples per replica per step (the payoff is measured on one such batch).
        paid: the run's last measured answer (:class:`ReadsPaid`): read, or updated by a measure; ``None``:
            nothing known (measured).
        peers: when several replicas' stage-0 ranks call this together (a collective in ``peers.group``), they
            split the carrying and filling between them and all-gather the results; the new boundary takes over
            the old one's memory. ``None``: this rank does it all alone.
        fill: ``False``: a rank alone (no ``peers``) that reads the cache does not fill it here; the steps store
            what they miss (the caller's choice, when a pass over the split would cost more than it saves).

    Returns:
        Whether stage 0 reads the cache, and why (the same answer on every peer).

    A cache that bypasses itself (random transforms, ``cache_policy = "bypass"``) is never read or filled. With
    per-epoch views every view is filled (each a fresh read of the dataset, so a fresh draw of its transforms).
    """
    cache, old_frozen, frozen = job.cache, job.old_frozen, job.frozen
    paid = ReadsPaid() if paid is None else paid
    if not cache.enabled:
        return False, BYPASS_REASON
    views = cache.config.views_per_sample
    if peers is not None and peers.count > 1:
        enabled, reason = _decide(job, mode=mode, per_replica=per_replica, paid=paid, old=old_frozen)
        agreed = all_peers(enabled, peers, job.device)  # every peer reads only if all would (the fill is a collective)
        if agreed:
            for view in range(views):
                cache.set_epoch(view)
                # the first pass carries every view's entries
                fill_shared(job if view == 0 else replace(job, old_frozen=frozen), peers)
            return True, reason
        if old_frozen and old_frozen != frozen:
            cache.drop(old_frozen)
        return False, reason if not enabled else f"{reason}, but not on another replica's stage 0: off on all"
    job.carry()  # only the newly frozen sub-layers run on the entries
    enabled, reason = _decide(job, mode=mode, per_replica=per_replica, paid=paid)
    if enabled and not fill:
        return True, f"{reason}; filled by the steps as they miss"
    if enabled:
        # Every rank may be handed any sample in a later epoch, so the whole training split is cached.
        for view in range(views):
            cache.set_epoch(view)
            fill_cache(
                cache,
                job.data,
                frozen,
                chunk=job.chunk,
                device=job.device,
                run_prefix=lambda v: job.run(v, 0, frozen),
            )
    return enabled, reason


def _decide(job: CacheJob, *, mode: str, per_replica: int, paid: ReadsPaid, old: int = 0) -> tuple[bool, str]:
    """``"on"``, or the measured answer for the whole fill, each tier weighed by the entries it would hold
    (:func:`elastic_pipe.cache.measure_tiered_payoff`), or ``paid``'s answer from a shallower boundary when it
    knows one (:meth:`ReadsPaid.known`); ``old``: a boundary whose space the fill will reuse."""
    if mode == "on":
        return True, "cache = 'on'"
    cache, frozen = job.cache, job.frozen
    reused = old if old and old != frozen and old in cache.boundaries() else frozen
    example = job.shape_example()
    shape, dtype = tuple(example.shape[1:]), example.dtype
    entries = (shape, dtype, cache.placement(reused, shape, dtype, len(job.data)))
    known = paid.known(frozen, entries)
    if known:
        return True, known
    decision = acache.measure_tiered_payoff(
        cache,
        job.data.input_rows(0, per_replica).to(job.device),
        reused,
        lambda v: job.run(v, 0, frozen),
        samples=len(job.data),
    )
    paid.record(frozen, entries, decision)
    return decision.enabled, decision.reason


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
