"""Persistent ``DataLoader``\\ s of a dataset split: one per way of reading it, kept across epochs.

A loader's worker processes cost a fork of the training process (large once the activation cache holds host
memory) and the workers' start-up, every time a loader is iterated anew; a loader built for every epoch pays that
every epoch. A :class:`LoaderPool` keeps one loader per :class:`LoaderKey` (which parts of the items are read, and
for which shard of the sampler) with ``persistent_workers``, and re-points it at each call's index lists through
its batch sampler, a :class:`Feed` (a loader's sampler cannot be replaced once it is built; its workers only map
positions to items, so the lists may change between iterations). A new key of the same kind replaces the loader of
the old one, whose workers are shut down: the sampler re-sharded at a transition, or a stage that now reads other
parts of the items.

Rules that keep this safe:

* one reader at a time per loader (iterating a persistent loader again resets its one iterator): a second reader of
  a key whose loader is still being read gets a loader of its own, shut down when that reader ends;
* a reader that raises drops its loader (the iterator's state after an error is not to be trusted); a reader
  closed early leaves it (the next iteration discards what the workers had read ahead);
* a read of plain lists may be served by an idle loader of another key that stacks more (:meth:`LoaderPool.covering`).

A list is read in parts (:func:`cut`, :class:`Parts`, at least :data:`MIN_PART` positions each) that several
workers read side by side, and joined again on the device (:func:`joined`); the workers are forked
(:data:`WORKER_START`), and :func:`make_loader` builds a loader with these settings.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import sys
from collections.abc import Callable, Generator, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

import torch
import torch.utils.data

__all__: list[str] = []  # internal: the package face exports what others use

#: What a loader yields: one batch per index list of its batch sampler.
B = TypeVar("B")
#: What a loader's dataset yields per position (the raw items its collate function stacks).
T = TypeVar("T")

#: ``build(batch_sampler, persistent)``: a ``DataLoader`` over the split reading ``batch_sampler``'s lists.
BuildLoader: TypeAlias = Callable[[Iterable[list[int]], bool], Iterable[B]]

#: The kinds of reads: the training steps (an ``ElasticBatchSampler``), plain index lists (the cache fill), and the
#: rows a rank reads for itself (``input_rows``: the set-up's profile, the cache's payoff measure and shared fill).
KINDS = ("steps", "lists", "rows")


@dataclass(frozen=True)
class LoaderKey:
    """What a loader reads.

    Attributes:
        kind: one of :data:`KINDS`; a new key replaces the pool's loader of the same kind.
        inputs: whether the inputs are stacked (the collate step is fixed when the workers start).
        labels: whether the labels are stacked.
        pin: whether batches land in page-locked memory.
        shard: ``(replicas, rank)`` of the sampler the steps come from (``None`` for plain lists).
    """

    kind: str
    inputs: bool
    labels: bool
    pin: bool
    shard: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


class Feed:
    """The batch sampler of a persistent loader: it walks the index lists it was given last."""

    def __init__(self) -> None:
        self.lists: Iterable[list[int]] = ()

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.lists)

    def __len__(self) -> int:
        return len(self.lists) if isinstance(self.lists, Sized) else 0


def stop_workers(*loaders: object) -> None:
    """Shut down the loaders' worker processes now (none, or never iterated: nothing), side by side: a shutdown mostly
    waits for forks of this process to exit, so several loaders' waits overlap instead of adding up (issue #41)."""
    stops: list[Callable[[], None]] = []
    for loader in loaders:
        stop = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
        if stop is not None:
            stops.append(stop)
    if len(stops) == 1:
        stops[0]()
    elif stops:
        with concurrent.futures.ThreadPoolExecutor(len(stops)) as pool:
            for done in [pool.submit(stop) for stop in stops]:
                done.result()  # a shutdown's error surfaces here, after every shutdown ran


@dataclass
class _Entry(Generic[B]):
    loader: Iterable[B]
    feed: Feed
    busy: bool = False


@dataclass
class LoaderPool(Generic[B]):
    """The loaders of one split, by :class:`LoaderKey` (at most one per kind), each yielding batches of type ``B``.

    Attributes:
        built: loaders constructed so far (each one a start of worker processes when the split has workers)."""

    built: int = 0
    _entries: dict[LoaderKey, _Entry[B]] = field(default_factory=dict)

    def read(
        self, key: LoaderKey, lists: Iterable[list[int]], build: BuildLoader[B], *, cover: bool = False
    ) -> Generator[B, None, None]:
        """The loader's batches for ``lists``, in order, from the pool's loader for ``key`` (built when absent; with
        ``cover``, an idle loader of :meth:`covering` serves it first: its batches may hold parts not asked for)."""
        entry = self._entries.get(key)
        if entry is not None and entry.busy:  # another reader of this key is open: a loader of its own
            yield from self._one_shot(lists, build)
            return
        if entry is None and cover and (served := self.covering(key)) is not None:
            key, entry = served, self._entries[served]
        if entry is None:
            entry = self._replace(key, build)
        entry.feed.lists = lists
        entry.busy = True
        failed = True
        try:
            with forking():
                batches = iter(entry.loader)  # a persistent loader's first iteration forks its workers
            yield from batches
            failed = False
        except GeneratorExit:  # closed early: the loader stays
            failed = False
            raise
        finally:
            entry.busy = False
            entry.feed.lists = ()
            if failed and self._entries.get(key) is entry:
                del self._entries[key]
                stop_workers(entry.loader)

    def covering(self, key: LoaderKey) -> LoaderKey | None:
        """An idle kept loader's key that can serve plain lists read as ``key`` (stacking at least its parts, pinned
        alike; its own kind first), or ``None`` (none, or ``key`` reads a sampler's shard): a one-pass read at a
        transition, the cache's fill or the evaluation store, forks no workers anew (issue #41)."""
        idle = [k for k, e in self._entries.items() if not e.busy and key.shard is None and k.pin == key.pin]
        fits = [k for k in idle if k.inputs >= key.inputs and k.labels >= key.labels]
        return min(fits, key=lambda k: k.kind != key.kind, default=None)  # its own kind first

    def start(self, key: LoaderKey, build: BuildLoader[B]) -> bool:
        """Build the loader for ``key`` and start its workers now, reading nothing yet, so that their start-up
        overlaps whatever the caller does next instead of the first :meth:`read` (a loader for ``key`` already
        kept, or another reader of its kind still open: nothing is done). Returns whether a loader was built."""
        if key in self._entries or any(e.busy for k, e in self._entries.items() if k.kind == key.kind):
            return False
        entry = self._replace(key, build)
        with forking():
            iter(entry.loader)  # forks the workers (a persistent loader keeps this iterator); the feed is empty
        return True

    def _replace(self, key: LoaderKey, build: BuildLoader[B]) -> _Entry[B]:
        """Shut down the kept loader of ``key``'s kind, then build the persistent loader for ``key`` over a new
        :class:`Feed` and keep it. Returns its entry."""
        for old in [k for k in self._entries if k.kind == key.kind]:
            stop_workers(self._entries.pop(old).loader)
        feed = Feed()
        entry = self._entries[key] = _Entry(build(feed, True), feed)
        self.built += 1
        return entry

    def _one_shot(self, lists: Iterable[list[int]], build: BuildLoader[B]) -> Iterator[B]:
        loader = build(lists, False)
        self.built += 1
        with forking():
            iterator = iter(loader)
        try:
            yield from iterator
        finally:
            stop = getattr(iterator, "_shutdown_workers", None)
            if stop is not None:
                stop()

    def keys(self) -> list[LoaderKey]:
        """The keys of the loaders kept."""
        return list(self._entries)

    def take(self) -> list[Iterable[B]]:
        """Forget every kept loader and hand them over (their workers still run: :func:`stop_workers` them)."""
        loaders = [entry.loader for entry in self._entries.values()]
        self._entries.clear()
        return loaders

    def close(self) -> None:
        """Shut down every kept loader's workers (side by side) and forget the loaders."""
        stop_workers(*self.take())


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Around a loader's first iteration, which forks its workers: every object this process holds so far is moved
    out of the garbage collector's reach (``gc.freeze``) until the workers are forked, so a worker never collects an
    unreachable cycle it inherited. One that holds a CUDA tensor would free it in the forked child, where CUDA cannot
    be used, and the worker would die (``CUDA error: initialization error``, seen under the time-to-accuracy benchmark
    on one H100). Cheap: freezing and thawing move whole generations, not objects; this process collects as before
    afterwards."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


#: How the loaders' worker processes start: forked where the platform has ``fork`` (Linux), whatever this process's
#: own start method is. A rank started by ``elastic-pipe train`` is a spawned process, whose default start method is
#: then ``spawn`` as well: each loader's workers would import torch, the model's modules and the dataset again and
#: receive the dataset pickled (5-6 s per loader start on a 2-core machine, at every epoch's first step and every
#: evaluation of a 2-epoch run; forked, a fraction of a second). The workers only map positions to items, and the
#: pinned cache slab is left out of forks (``MADV_DONTFORK``). ``None`` (the platform's default) elsewhere.
WORKER_START: str | None = "fork" if sys.platform.startswith("linux") else None

#: The fewest positions a worker reads of one list (a split cuts each list into parts of at least this many, one per
#: worker): smaller parts cost more in hand-offs between processes than reading them side by side saves.
MIN_PART = 32


def make_loader(
    items: torch.utils.data.Dataset[T],
    batch_sampler: Iterable[list[int]],
    collate: Callable[[list[T]], object],
    *,
    workers: int,
    pin: bool,
    persistent: bool,
) -> torch.utils.data.DataLoader[T]:
    """A ``DataLoader`` reading ``batch_sampler``'s lists of ``items`` and stacking each with ``collate``, in
    ``workers`` worker processes (forked: :data:`WORKER_START`; 0: in this process), kept across iterations when
    ``persistent``."""
    # A list is read in up to ``workers`` parts (:class:`Parts`), so twice as many parts per worker as lists
    # keep as many lists read ahead as one part per list would.
    return torch.utils.data.DataLoader(
        items,
        batch_sampler=batch_sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        persistent_workers=persistent and workers > 0,
        prefetch_factor=2 * workers if workers > 1 else None,
        multiprocessing_context=WORKER_START if workers > 0 else None,
    )


def cut(positions: list[int], workers: int) -> list[list[int]]:
    """``positions`` in consecutive parts of nearly equal length, one per worker but at least :data:`MIN_PART`
    positions each (one part without workers): the parts of one list are read by different workers at the same
    time, so a list's batch is ready in a fraction of the time one worker takes for all of it (the first step of
    an epoch waits for it)."""
    k = max(1, min(workers, len(positions) // MIN_PART))
    q, r = divmod(len(positions), k)
    bounds = [i * q + min(i, r) for i in range(k + 1)]
    return [positions[bounds[i] : bounds[i + 1]] for i in range(k)]


class Parts:
    """The parts (:func:`cut` for ``workers``) of each of ``lists``, in order: what a split's loader reads (its
    batch sampler's lists)."""

    def __init__(self, lists: Iterable[list[int]], workers: int) -> None:
        self.lists, self.workers = lists, workers

    def __iter__(self) -> Iterator[list[int]]:
        for positions in self.lists:
            yield from cut(positions, self.workers)


def joined(parts: list[torch.Tensor | None], device: torch.device) -> torch.Tensor | None:
    """The parts of one list's batch, one after the other in one tensor on ``device`` (copied there without
    waiting, from pinned memory when the loader pins)."""
    if parts[0] is None:
        return None
    if len(parts) == 1:
        return parts[0].to(device, non_blocking=True)
    tensors = [p for p in parts if p is not None]
    first = tensors[0]
    rows = sum(int(p.shape[0]) for p in tensors)
    out = torch.empty((rows, *first.shape[1:]), dtype=first.dtype, device=device)
    row = 0
    for part in tensors:
        out[row : row + part.shape[0]].copy_(part, non_blocking=True)
        row += int(part.shape[0])
    return out
