"""The frozen prefix's activation cache during an epoch, on a stage-0 rank: each step's lookup started a step ahead,
the boundary activations read (recomputing the misses), whether the cache covers the split, and the epoch's
counters (building and filling it: :mod:`~elastic_pipe.orchestrator.prefix.fill`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from elastic_pipe import cache as acache
    from elastic_pipe.orchestrator.data import Batch, StepData

__all__: list[str] = []  # internal: the package face exports what others use


class PrefetchedBatches:
    """A step's batches with the next step's cache lookup already under way.

    Iterating yields the batches unchanged; when batch ``i`` is handed over, batch ``i + 1`` has been read and its
    lookup started (:meth:`~elastic_pipe.cache.ActivationCache.prefetch`: on a GPU, the gathers and copies run on
    a side stream while step ``i`` computes), and :meth:`take` hands a step its lookup. A step's own writes (the
    misses it recomputes) belong to other samples than the next step's, so an early lookup misses nothing.

    Args:
        batches: the loader's batches (``Batch``: positions, inputs, labels).
        cache: the cache to read.
        frozen: the boundary read.
        host_ids: the training split's sample ids on the host, by position.
    """

    def __init__(
        self, batches: Iterator[Batch], cache: acache.ActivationCache, frozen: int, host_ids: torch.Tensor
    ) -> None:
        self._batches = batches
        self._cache = cache
        self._frozen = frozen
        self._host_ids = host_ids
        self._pending: collections.deque[tuple[torch.Tensor, acache.PendingLookup]] = collections.deque()
        self._iter = self._generate()

    def __iter__(self) -> PrefetchedBatches:
        return self

    def __next__(self) -> Batch:
        return next(self._iter)

    def _generate(self) -> Iterator[Batch]:
        ahead = next(self._batches, None)
        if ahead is not None:
            self._start(ahead)
        while ahead is not None:
            current, ahead = ahead, next(self._batches, None)
            if ahead is not None:
                self._start(ahead)
            yield current

    def _start(self, batch: Batch) -> None:
        ids = self._host_ids[batch.positions]
        self._pending.append((ids, self._cache.prefetch(ids, self._frozen)))

    def take(self, ids: torch.Tensor) -> acache.CacheLookup | None:
        """The lookup started for ``ids`` (the batch being run), or ``None`` when none was."""
        while self._pending:
            started, pending = self._pending.popleft()
            if started.shape == ids.shape and torch.equal(started, ids):
                return pending.result()
        return None

    def close(self) -> None:
        """Let the loader's workers go (a stop at ``max_steps``)."""
        self._pending.clear()
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def read_prefix(
    cache: acache.ActivationCache,
    lookup: acache.CacheLookup | None,
    ids: torch.Tensor,
    x: torch.Tensor | None,
    *,
    frozen: int,
    run_prefix: Callable[[torch.Tensor], torch.Tensor],
    read_inputs: Callable[[torch.Tensor], torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """A batch's prefix output from its (prefetched) lookup; the misses are computed and stored, the hits read.

    A batch with any miss runs the prefix whole, at its own size, and keeps the rows of its misses: a forward on
    the misses alone would run at a new size at nearly every step of an epoch that fills the cache, and on a GPU
    each new size pays its kernels' set-up again (tens of milliseconds with cuDNN's attention, more than the rows
    it saves; docs/benchmarks.md, "What a batch of a new size costs").

    Args:
        x: the batch's inputs on the device, or ``None`` when the step did not load them (a complete cache):
            ``read_inputs(missing_ids)`` then reads the inputs of the misses alone (an entry that failed its
            crc32, say) and only they run.
        dtype: the dtype the layers after the boundary expect (the prefix output's): hits stored narrower
            (``[pipeline] cache_dtype``) are cast back to it on the device, and the recomputed misses are
            rounded through the storage dtype (:meth:`~elastic_pipe.cache.ActivationCache.rounded`), so a
            sample's value does not depend on whether it hit. ``None``: the hits as stored.
    """
    if lookup is None:
        lookup = cache.get(ids, frozen)
    if dtype is not None:
        lookup = lookup.to(dtype)
    if lookup.num_hits == ids.numel():
        return lookup.values
    if x is None:
        assert read_inputs is not None, "a step without inputs needs read_inputs"
        device = lookup.values.device if lookup.num_hits else cache.device
        with torch.no_grad():
            computed = run_prefix(read_inputs(lookup.missing_ids).to(device))
    else:  # the batch as it is; with some rows cached, the misses' rows of its output
        with torch.no_grad():
            computed = run_prefix(x)
        if lookup.num_hits:
            computed = computed[(~lookup.hit).to(computed.device)]
    cache.put(lookup.missing_ids, frozen, computed)
    return lookup.merge(cache.rounded(computed))


def covers(cache: acache.ActivationCache, data: StepData, frozen: int) -> bool:
    """Whether ``cache`` (enabled) holds an entry at ``frozen`` for every sample of ``data``, every view of it."""
    if not cache.enabled:
        return False
    ids = data.sample_ids.to("cpu", torch.int64)
    views = cache.config.views_per_sample
    try:
        for view in range(views):
            cache.set_epoch(view)
            if not bool(cache.cached(ids, frozen).all()):
                return False
    finally:
        cache.set_epoch(0)
    return True


def held(cache: acache.ActivationCache, data: StepData, frozen: int, example: torch.Tensor) -> tuple[int, int]:
    """Entries ``cache`` holds at ``frozen`` for the samples of ``data`` (every tier), and their bytes as stored
    (``example``: one sample's prefix output at ``frozen``)."""
    entries = int(cache.cached(data.sample_ids.to("cpu", torch.int64), frozen).sum())
    return entries, entries * example[0].numel() * cache.stored_dtype(example.dtype).itemsize


#: The counters an epoch record reports for the cache, summed over the stage-0 ranks.
EPOCH_COUNTERS = ("cache_hits", "cache_misses", "cache_corrupt")


def counters(cache: acache.ActivationCache | None) -> tuple[int, int, int]:
    """This rank's running totals of :data:`EPOCH_COUNTERS`."""
    if cache is None:
        return 0, 0, 0
    stats = cache.stats
    return stats.hits, stats.misses, stats.corrupt


def epoch_counts(
    before: tuple[int, int, int], cache: acache.ActivationCache | None, device: torch.device
) -> dict[str, int]:
    """The epoch's cache counters summed over every rank (a collective): lookups served from a tier, missed (and
    recomputed), and entries that failed their crc32 and were recomputed instead of used."""
    now = counters(cache)
    mine = torch.tensor([a - b for a, b in zip(now, before, strict=True)], dtype=torch.float64, device=device)
    dist.all_reduce(mine)
    return {name: int(v) for name, v in zip(EPOCH_COUNTERS, mine.tolist(), strict=True)}
