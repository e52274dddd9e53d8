"""The activation cache: the frozen prefix's output per (sample id, frozen boundary), over stacked tiers.

A read of a batch asks each tier in turn (device, then host, then disk) for the ids still missing: one gather per
tier. A write skips ids already cached anywhere and fills the tiers in the same order while their budgets last
(spilling to the next tier); what fits nowhere is not cached and is recomputed on its next miss. There is no
eviction: every epoch reads every sample once, so swapping one entry for another cannot raise the hit rate.

When the frozen boundary moves from ``b`` to ``b'``, :meth:`ActivationCache.extend` runs only layers ``b..b'-1``
on the cached values (in place, chunk by chunk) and the entries of ``b`` are gone afterwards.

Sharing across the processes of a node: give every process the same ``name`` (and ``host_dir``/``disk_dir``) and
make exactly one of them the ``leader``. Reads and writes need no coordination. :meth:`~ActivationCache.extend` and
:meth:`~ActivationCache.drop` are node-wide: call them on every process between two barriers; the leader rewrites
and deletes the shared files, the others only let go of their handles.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from elastic_pipe.cache.config import (
    Augmentation,
    CacheConfig,
    CacheTiers,
    HostKind,
    OnRandomAugmentation,
    default_host_dir,
    default_name,
    parse_choice,
)
from elastic_pipe.cache.decision import time_call
from elastic_pipe.cache.dtypes import stored_dtype
from elastic_pipe.cache.errors import CHECK, CacheError
from elastic_pipe.cache.layout import SegmentLayout
from elastic_pipe.cache.results import CacheLookup, CacheStats, PendingLookup, TierStats
from elastic_pipe.cache.segments import Segment, ShapeChangedError, index_on
from elastic_pipe.cache.tiers import DeviceTier, FileTier, Tier, check_writable

__all__ = ["ActivationCache"]

Transform = Callable[[torch.Tensor], torch.Tensor]

#: Entries transformed per chunk by :meth:`ActivationCache.extend` (bounds its extra memory).
DEFAULT_EXTEND_BATCH = 256


class ActivationCache:
    """A tiered cache of the frozen prefix's output, keyed by (sample id, frozen boundary).

    Args:
        num_samples: dataset size; sample ids are ``0..num_samples-1``.
        device_budget: bytes on the compute device (0: no device tier).
        host_budget: bytes of node-shared memory under ``host_dir`` (0: no host tier).
        disk_budget: bytes on disk under ``disk_dir`` (0: no disk tier), each entry checksummed.
        device: compute device; reads return tensors there.
        name: segment file prefix; processes using the same name share the host and disk tiers.
        host_dir: host tier directory (default ``/dev/shm``).
        disk_dir: disk tier directory.
        augmentation: what the data pipeline declares, ``"none"`` or ``"random"``.
        on_random_augmentation: ``"error"`` (default), ``"bypass"`` or ``"views"``.
        views: per-epoch views per sample kept under ``"views"``.
        leader: whether this process deletes and renames shared files (one per node).
        fingerprint: names the model whose frozen prefix produces the entries
            (:func:`~elastic_pipe.cache.prefix_fingerprint`); host and disk files of another one are never read.
        host_kind: ``"shared"`` (files under ``host_dir``, shared by the node) or ``"pinned"`` (page-locked memory
            private to the process).
        storage_dtype: a narrower floating dtype every tier stores the entries in (``None``: as they are put;
            see :meth:`stored_dtype`). Reads then return the stored dtype; :meth:`rounded` gives a computed
            value the rounding a stored one has.

    Raises:
        CacheDirError: the host (shared) or disk directory of an enabled tier cannot be created or written.
        CacheError: invalid configuration, including random augmentation without an explicit policy.

    Example:
        >>> cache = ActivationCache(100, device_budget=1 << 20)
        >>> ids = torch.arange(4)
        >>> cache.put(ids, 2, torch.ones(4, 8))
        4
        >>> cache.get(ids, 2).num_hits
        4
    """

    def __init__(
        self,
        num_samples: int,
        *,
        device_budget: int = 0,
        host_budget: int = 0,
        disk_budget: int = 0,
        device: str | torch.device = "cpu",
        name: str | None = None,
        host_dir: str | Path | None = None,
        disk_dir: str | Path | None = None,
        augmentation: str = "none",
        on_random_augmentation: str = "error",
        views: int = 1,
        leader: bool = True,
        fingerprint: str = "",
        host_kind: str = "shared",
        storage_dtype: torch.dtype | None = None,
    ) -> None:
        CHECK.instance("device", device, str | torch.device)
        for key, value in (("name", name), ("host_dir", host_dir), ("disk_dir", disk_dir)):
            if value is not None:
                CHECK.instance(key, value, str if key == "name" else str | Path)
        config = CacheConfig(
            num_samples=num_samples,
            device_budget=device_budget,
            host_budget=host_budget,
            disk_budget=disk_budget,
            device=torch.device(device),
            name=default_name() if name is None else name,
            host_dir=default_host_dir() if host_dir is None else Path(host_dir),
            disk_dir=None if disk_dir is None else Path(disk_dir),
            augmentation=parse_choice(Augmentation, augmentation, "augmentation"),
            on_random_augmentation=parse_choice(OnRandomAugmentation, on_random_augmentation, "on_random_augmentation"),
            views=views,
            leader=leader,
            fingerprint=fingerprint,
            host_kind=parse_choice(HostKind, host_kind, "host_kind"),
            storage_dtype=storage_dtype,
        )
        self._setup(config)

    @classmethod
    def from_config(cls, config: CacheConfig) -> ActivationCache:
        """Build a cache from a validated :class:`CacheConfig`.

        Raises:
            CacheDirError: the host (shared) or disk directory of an enabled tier cannot be created or written.
        """
        cache = cls.__new__(cls)
        cache._setup(config)
        return cache

    @classmethod
    def from_tiers(
        cls,
        num_samples: int,
        tiers: CacheTiers,
        *,
        device: str | torch.device = "cpu",
        name: str | None = None,
        fingerprint: str = "",
        leader: bool = True,
        augmentation: str = "none",
        on_random_augmentation: str = "error",
        views: int = 1,
        storage_dtype: torch.dtype | None = None,
    ) -> ActivationCache:
        """Build a cache from a run's :class:`CacheTiers`.

        Args:
            num_samples: dataset size; sample ids are ``0..num_samples-1``.
            tiers: the tier budgets and directories.
            device: compute device; reads return tensors there.
            name: segment-file prefix; the node's processes that share the host tier pass the same one.
            fingerprint: names the model whose prefix produces the entries
                (:func:`~elastic_pipe.cache.prefix_fingerprint`).
            leader: whether this process deletes and renames the shared files (one per node, e.g. local rank 0).
            augmentation: as for the constructor.
            on_random_augmentation: as for the constructor.
            views: as for the constructor.
            storage_dtype: as for the constructor.

        Raises:
            CacheDirError: the disk (or shared host) directory cannot be created or written.
            CacheError: invalid configuration.

        Example:
            >>> tiers = CacheTiers.parse("256MiB", host="1GiB", host_kind="pinned")
            >>> ActivationCache.from_tiers(100, tiers).stats.tiers[1].name
            'host'
        """
        config = CacheConfig(
            num_samples=num_samples,
            device_budget=tiers.device_bytes,
            host_budget=tiers.host_bytes,
            disk_budget=tiers.disk_bytes,
            device=torch.device(device),
            name=default_name() if name is None else name,
            host_dir=Path(tiers.host_dir) if tiers.host_dir else default_host_dir(),
            disk_dir=Path(tiers.disk_dir) if tiers.disk_dir else None,
            augmentation=parse_choice(Augmentation, augmentation, "augmentation"),
            on_random_augmentation=parse_choice(OnRandomAugmentation, on_random_augmentation, "on_random_augmentation"),
            views=views,
            leader=leader,
            fingerprint=fingerprint,
            host_kind=tiers.host_kind,
            storage_dtype=storage_dtype,
        )
        return cls.from_config(config)

    def _setup(self, config: CacheConfig) -> None:
        self.config = config
        self._num_keys = config.num_samples * config.views_per_sample
        self._epoch = 0
        tiers: list[Tier] = []
        if config.device_budget > 0:
            tiers.append(DeviceTier(config.device_budget, config.device, self._num_keys))
        if config.host_budget > 0 and config.host_kind is HostKind.PINNED:
            # page-locked memory only helps copies to a GPU (and needs one): plain memory otherwise
            pin = config.device.type == "cuda" and torch.cuda.is_available()
            tiers.append(DeviceTier(config.host_budget, torch.device("cpu"), self._num_keys, name="host", pin=pin))
        elif config.host_budget > 0:
            check_writable("host", config.host_dir)
            tiers.append(
                FileTier(
                    "host",
                    config.host_dir,
                    config.name,
                    config.host_budget,
                    self._num_keys,
                    checksum=False,
                    leader=config.leader,
                    fingerprint=config.fingerprint,
                )
            )
        if config.disk_budget > 0:
            assert config.disk_dir is not None  # checked by CacheConfig
            check_writable("disk", config.disk_dir)
            tiers.append(
                FileTier(
                    "disk",
                    config.disk_dir,
                    config.name,
                    config.disk_budget,
                    self._num_keys,
                    checksum=True,
                    leader=config.leader,
                    fingerprint=config.fingerprint,
                )
            )
        self._tiers = tiers
        self._side_stream: torch.cuda.Stream | None = None
        self.reset_stats()

    # ------------------------------------------------------------------------------------------------ keys
    @property
    def enabled(self) -> bool:
        """False when the cache bypasses itself (random augmentation with ``on_random_augmentation='bypass'``)."""
        return self.config.enabled

    @property
    def device(self) -> torch.device:
        """Where reads land."""
        return self.config.device

    def stored_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype entries put in ``dtype`` are stored (and read) in: the config's ``storage_dtype`` where it
        narrows a floating ``dtype``, else ``dtype`` (:func:`~elastic_pipe.cache.stored_dtype`)."""
        return stored_dtype(dtype, self.config.storage_dtype)

    def rounded(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` as a read of their stored entries would give them back once cast to ``values.dtype``:
        rounded through the storage dtype (``values`` itself when entries are stored as given). A batch that
        mixes hits with recomputed misses rounds the misses too, so a sample's value does not depend on whether
        it hit."""
        narrow = self.stored_dtype(values.dtype)
        return values if narrow == values.dtype else values.to(narrow).to(values.dtype)

    def set_epoch(self, epoch: int) -> None:
        """Select the per-epoch view (``epoch % views``) that reads and writes use; a no-op without views."""
        if epoch < 0:
            raise CacheError(f"epoch must be >= 0, got {epoch}")
        self._epoch = epoch

    def _keys(self, sample_ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(sample_ids, torch.Tensor) or sample_ids.dim() != 1:
            raise CacheError(f"sample_ids must be a 1-D integer tensor, got {_describe(sample_ids)}")
        if sample_ids.dtype.is_floating_point or sample_ids.dtype.is_complex or sample_ids.dtype == torch.bool:
            raise CacheError(f"sample_ids must be an integer tensor, got dtype {sample_ids.dtype}")
        ids = sample_ids.to("cpu", torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.num_samples):
            raise CacheError(
                f"sample ids must lie in [0, {self.config.num_samples}), got min {int(ids.min())}, max {int(ids.max())}"
            )
        views = self.config.views_per_sample
        return ids * views + self._epoch % views if views > 1 else ids

    @staticmethod
    def _check_boundary(boundary: int) -> None:
        if isinstance(boundary, bool) or not isinstance(boundary, int) or boundary < 0:
            raise CacheError(f"boundary must be an int >= 0 (the number of frozen layers), got {boundary!r}")

    # ------------------------------------------------------------------------------------------------ read
    def get(self, sample_ids: torch.Tensor, boundary: int) -> CacheLookup:
        """Look a batch up: one gather per tier that holds some of it.

        Args:
            sample_ids: 1-D integer tensor of dataset ids (keep them on the CPU: ids on a GPU are copied back,
                which waits for the work queued there).
            boundary: the frozen boundary (number of frozen layers) whose output is wanted.

        Returns:
            The hit mask and the hits' values on :attr:`device`, in the dtype they are stored in
            (:meth:`stored_dtype`; :meth:`CacheLookup.to` casts them back).

        Raises:
            CacheError: ids outside ``[0, num_samples)``, not a 1-D integer tensor, or a negative boundary.
        """
        self._check_boundary(boundary)
        keys = self._keys(sample_ids)
        ids = sample_ids.to("cpu", torch.int64)
        hit = torch.zeros(keys.numel(), dtype=torch.bool)
        empty = torch.empty(0, device=self.device)
        if not self.enabled:
            self._misses += keys.numel()
            return CacheLookup(ids, hit, empty)
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        for tier in self._tiers:
            pending = (~hit).nonzero().flatten()
            if pending.numel() == 0:
                break
            segment = tier.segment(boundary)
            if segment is None:
                continue
            result = segment.read(keys[pending], self.device)
            self._corrupt += result.corrupt
            found = pending[result.found]
            if found.numel():
                hit[found] = True
                parts.append((found, result.values))
                self._tier_hits[tier.name] += found.numel()
        num_hits = int(hit.sum())
        self._hits += num_hits
        self._misses += keys.numel() - num_hits
        if not parts:
            return CacheLookup(ids, hit, empty)
        if len(parts) == 1:  # positions ascend within a tier, so one tier's rows are already in batch order
            return CacheLookup(ids, hit, parts[0][1])
        first = parts[0][1]
        values = torch.empty((num_hits, *first.shape[1:]), dtype=first.dtype, device=self.device)
        rank = torch.cumsum(hit.to(torch.int64), 0) - 1
        for positions, rows in parts:  # each tier's rows into their batch positions, the index through pinned
            # memory: a pageable index would hold the host until the stream's copies queued before it had run
            values.index_copy_(0, index_on(rank[positions], self.device), rows)
        return CacheLookup(ids, hit, values)

    def cached(self, sample_ids: torch.Tensor, boundary: int) -> torch.Tensor:
        """Which ids have an entry at ``boundary`` in some tier (the index only: no value is read or verified, and
        nothing is counted). A disk entry that fails its crc32 later is still a miss when it is read.

        Raises:
            CacheError: as for :meth:`get`.
        """
        self._check_boundary(boundary)
        keys = self._keys(sample_ids)
        found = torch.zeros(keys.numel(), dtype=torch.bool)
        if not self.enabled:
            return found
        for tier in self._tiers:
            segment = tier.segment(boundary)
            if segment is not None:
                found |= segment.contains(keys)
        return found

    def prefetch(self, sample_ids: torch.Tensor, boundary: int) -> PendingLookup:
        """Start a lookup now, use it later: on a GPU the host-to-device copies run on a side stream and overlap
        the current step (issued here: from a pinned host tier one copy per run of slots; from ``/dev/shm`` or disk
        files a host-side gather into a pinned buffer first).

        Example::

            pending = cache.prefetch(next_ids, boundary)   # before this step's compute
            ...                                            # this step
            lookup = pending.result()                      # next step: no host synchronization

        Returns:
            A handle whose ``result()`` is the :class:`CacheLookup`; counters are updated at once.
        """
        if self.device.type != "cuda":
            return PendingLookup(self.get(sample_ids, boundary))
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # torch stub
        side = self._side_stream
        side.wait_stream(torch.cuda.current_stream(self.device))  # see every write queued before the call
        with torch.cuda.stream(side):
            lookup = self.get(sample_ids, boundary)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch stub
            event.record(side)
        return PendingLookup(lookup, event)

    # ------------------------------------------------------------------------------------------------ write
    def put(self, sample_ids: torch.Tensor, boundary: int, values: torch.Tensor) -> int:
        """Store a batch's prefix outputs, skipping ids already cached, filling tiers in order (one scatter each).

        Args:
            sample_ids: 1-D integer tensor of dataset ids (duplicates keep their first row; on the CPU, as for
                :meth:`get`).
            boundary: the frozen boundary the values belong to.
            values: ``len(sample_ids)`` rows; every row of one boundary must share shape and dtype. They are
                stored in :meth:`stored_dtype` (cast where they are, before any copy to another tier).

        Returns:
            The number of entries newly stored; ids that fit in no tier count in ``stats.rejected``.

        Raises:
            CacheError: bad ids or boundary, a row count that differs from the ids, zero-byte rows, or rows whose
                shape/dtype differs from the boundary's existing entries.
        """
        self._check_boundary(boundary)
        keys = self._keys(sample_ids)
        if values.dim() < 1 or values.shape[0] != keys.numel():
            raise CacheError(f"values need one row per sample id ({keys.numel()}), got shape {tuple(values.shape)}")
        if not self.enabled or keys.numel() == 0:
            return 0
        if values[0].numel() == 0:
            raise CacheError(f"cannot cache zero-byte entries of shape {tuple(values.shape[1:])}")
        _, first = np.unique(keys.numpy(), return_index=True)
        if first.size == keys.numel():  # no duplicates: the rows as given (no gather, no host-device copy)
            return self._put_keys(keys, boundary, values.detach())
        rows = torch.from_numpy(np.sort(first))
        return self._put_keys(keys[rows], boundary, values.detach()[rows.to(values.device)])

    def _put_keys(self, keys: torch.Tensor, boundary: int, values: torch.Tensor) -> int:
        values = values.to(self.stored_dtype(values.dtype))
        shape, dtype = tuple(values.shape[1:]), values.dtype
        segments: list[tuple[Tier, Segment | None]] = [(t, t.segment(boundary)) for t in self._tiers]
        pending = torch.ones(keys.numel(), dtype=torch.bool)
        for _, segment in segments:
            if segment is not None:
                _check_layout(segment, shape, dtype, boundary)
                pending &= ~segment.contains(keys)
        stored = 0
        # the keys the private tiers so far have no slot for (a key is held once: a private tier after them never
        # needs more; a reused slot keeps its key, so the count holds across in-place extensions)
        unheld = self._num_keys
        for tier, existing in segments:
            todo = pending.nonzero().flatten()
            if todo.numel() == 0:
                break
            segment = existing if existing is not None else tier.create(boundary, shape, dtype, most=unheld)
            if segment is None:
                continue
            if isinstance(tier, DeviceTier):
                unheld -= segment.layout.capacity
            _check_layout(segment, shape, dtype, boundary)
            rows = values if todo.numel() == keys.numel() else values.index_select(0, index_on(todo, values.device))
            present, written = segment.write(keys[todo], rows)
            stored += written
            pending[todo[present]] = False
        self._stored += stored
        self._rejected += int(pending.sum())
        return stored

    def get_or_compute(
        self, sample_ids: torch.Tensor, boundary: int, inputs: torch.Tensor, prefix: Transform
    ) -> torch.Tensor:
        """The prefix output for a whole batch: cached rows for hits, ``prefix(inputs[misses])`` for the rest
        (run under ``no_grad`` and then cached).

        Args:
            sample_ids: the batch's dataset ids.
            boundary: frozen boundary.
            inputs: the batch's inputs to the model (rows aligned with ``sample_ids``).
            prefix: runs the frozen layers ``0..boundary-1``.

        Returns:
            ``len(sample_ids)`` rows on the device of the computed rows (or the cache's device, in the stored
            dtype, if all hit); with a narrower ``storage_dtype`` the hits are cast to the computed rows' dtype
            and the computed rows are :meth:`rounded` like them.
        """
        lookup = self.get(sample_ids, boundary)
        if lookup.num_hits == sample_ids.numel():
            return lookup.values
        miss = ~lookup.hit
        with torch.no_grad():
            computed = prefix(inputs[miss.to(inputs.device)])
        self.put(lookup.missing_ids, boundary, computed)
        return lookup.to(computed.dtype).merge(self.rounded(computed))

    # ------------------------------------------------------------------------------------------------ boundaries
    def extend(
        self,
        old_boundary: int,
        new_boundary: int,
        fn: Transform,
        *,
        batch_size: int = DEFAULT_EXTEND_BATCH,
        only: torch.Tensor | None = None,
    ) -> int:
        """Move entries from ``old_boundary`` to ``new_boundary`` by running ``fn`` (layers ``old..new-1``) on them.

        Entries are rewritten in place, ``batch_size`` at a time, under ``no_grad``; if ``fn`` changes the entry
        shape they are re-stored through :meth:`put` instead (those that no longer fit are recomputed on their
        next miss). Any entries already stored for ``new_boundary`` are replaced. Afterwards ``old_boundary`` has
        no entries and its memory is returned. On a node-shared cache, call it on every process between two
        barriers: the leader rewrites the shared files.

        With ``only``, just those samples' entries are extended; the others' slots stay reserved (as empty
        entries of ``new_boundary``) for a later :meth:`put` of the same ids, so the new boundary gets all of the
        old one's memory. This is how peers that each compute a share of the entries fill the new boundary inside
        the old one's budget. If ``fn`` changes the entry shape, nothing is carried under ``only``: both
        boundaries are dropped first, so the new one gets the whole budget, and every entry is recomputed.

        Args:
            old_boundary: the cached boundary ``b``.
            new_boundary: the new boundary ``b' > b``.
            fn: maps a chunk of ``b`` outputs to ``b'`` outputs (``fn`` sees tensors on :attr:`device`, in the
                stored dtype: cast them to what the layers expect; its outputs are stored in :meth:`stored_dtype`).
            batch_size: entries per chunk.
            only: sample ids (1-D, on the CPU) whose entries are extended; ``None``: every entry.

        Returns:
            Entries this process extended.

        Raises:
            CacheError: ``new_boundary <= old_boundary``, a negative boundary, ``batch_size < 1``, or ``only``
                holding ids outside ``[0, num_samples)``.
        """
        self._check_boundary(old_boundary)
        self._check_boundary(new_boundary)
        if new_boundary <= old_boundary:
            raise CacheError(
                f"extend moves the boundary forward: need new_boundary > old_boundary, got {old_boundary} -> "
                f"{new_boundary}"
            )
        if batch_size < 1:
            raise CacheError(f"batch_size must be >= 1, got {batch_size}")
        self._settle_reads()
        fn = functools.partial(_narrowed, fn, self.stored_dtype)
        keep = None
        if only is not None:
            keep = torch.zeros(self._num_keys, dtype=torch.bool)
            keep[self._keys(only)] = True
        done = 0
        with torch.no_grad():
            try:
                for tier in self._tiers:
                    mine = isinstance(tier, DeviceTier) or tier.leader
                    segment = tier.segment(old_boundary) if mine else None
                    if segment is not None:
                        done += segment.transform(fn, batch_size, self.device, keep)
                    tier.rename(old_boundary, new_boundary)
            except ShapeChangedError:
                if keep is not None:
                    self.drop(new_boundary)
                    self.drop(old_boundary)
                    return 0
                done = self._extend_reshaped(old_boundary, new_boundary, fn, batch_size)
        return done

    def _extend_reshaped(self, old: int, new: int, fn: Transform, batch_size: int) -> int:
        done = 0
        for tier in self._tiers:
            tier.drop(new)
        for tier in self._tiers:
            mine = isinstance(tier, DeviceTier) or tier.leader
            segment = tier.segment(old) if mine else None
            if segment is None:
                continue
            keys = segment.valid_keys()
            for start in range(0, keys.numel(), batch_size):
                chunk = keys[start : start + batch_size]
                result = segment.read(chunk, self.device)
                self._corrupt += result.corrupt
                if result.values.shape[0]:
                    done += self._put_keys(chunk[result.found], new, fn(result.values))
        self.drop(old)
        return done

    def drop(self, boundary: int) -> int:
        """Delete every entry of ``boundary`` in every tier and return the memory.

        Returns:
            Bytes released by this process (device segments, and shared files when it is the leader).
        """
        self._check_boundary(boundary)
        self._settle_reads()
        return sum(tier.drop(boundary) for tier in self._tiers)

    def _settle_reads(self) -> None:
        """Wait for the copies of lookups started ahead (:meth:`prefetch`) before entries are rewritten in place or
        freed: a pinned host slab is read by DMA on the side stream, straight from its slots."""
        if self._side_stream is not None:
            self._side_stream.synchronize()

    def boundaries(self) -> list[int]:
        """Boundaries with entries in some tier."""
        return sorted({b for tier in self._tiers for b in tier.boundaries()})

    def shares(self, boundary: int) -> bool:
        """Whether a node-shared tier (the ``/dev/shm`` host tier or the disk tier, files every process of the node
        opens) holds entries at ``boundary``: :meth:`extend` rewrites those on the leader only, for every sample."""
        return any(isinstance(tier, FileTier) and boundary in tier.boundaries() for tier in self._tiers)

    # ------------------------------------------------------------------------------------------------ planning
    def placement(self, boundary: int, shape: tuple[int, ...], dtype: torch.dtype, samples: int) -> dict[str, int]:
        """Where a fill of ``samples`` samples' entries (every view of each) at ``boundary`` would land.

        Writes fill the tiers in order while their budgets last (:meth:`put`), so this is arithmetic over the
        budgets left now; nothing is allocated. ``dtype`` is the entries' as put: they are sized as stored
        (:meth:`stored_dtype`).

        Returns:
            Entries per tier name, in fill order, and under ``"none"`` those that fit nowhere (recomputed).
        """
        self._check_boundary(boundary)
        dtype = self.stored_dtype(dtype)
        left = samples * self.config.views_per_sample if self.enabled else 0
        spread: dict[str, int] = {}
        for tier in self._tiers:
            spread[tier.name] = taken = min(left, tier.capacity_for(boundary, shape, dtype))
            left -= taken
        spread["none"] = left if self.enabled else samples
        return spread

    def time_reads(self, rows: torch.Tensor, *, repeats: int = 5, warmup: int = 1) -> dict[str, float]:
        """Seconds to read a batch like ``rows`` from each tier, through a scratch segment outside the budgets.

        Each tier's scratch segment holds ``rows`` as the tier would store them (:meth:`stored_dtype`; device: on
        the device; host: pinned memory or a ``/dev/shm`` file; disk: a checksummed file, warm in the page cache)
        and is read back with the gather a step does.

        Returns:
            Seconds per batch read (the minimum over ``repeats``), per tier name; ``inf`` for a tier whose
            directory refuses the space.

        Raises:
            CacheError: ``rows`` is empty.
        """
        n = int(rows.shape[0])
        if n == 0:
            raise CacheError("time_reads needs at least one row")
        rows = rows.detach().to(self.stored_dtype(rows.dtype))
        layout = SegmentLayout(tuple(rows.shape[1:]), rows.dtype, n, n)
        keys = torch.arange(n)
        seconds: dict[str, float] = {}
        for tier in self._tiers:
            try:
                segment = tier.scratch(layout)
            except OSError:
                seconds[tier.name] = math.inf
                continue
            try:
                segment.write(keys, rows.detach())
                seconds[tier.name] = time_call(
                    functools.partial(segment.read, keys, self.device), repeats=repeats, warmup=warmup, statistic="min"
                )
            finally:
                segment.close()
        return seconds

    # ------------------------------------------------------------------------------------------------ state
    @property
    def stats(self) -> CacheStats:
        """A snapshot of this process's counters and every tier's occupancy."""
        tiers = []
        for tier in self._tiers:
            entries = 0
            for b in tier.boundaries():
                segment = tier.segment(b)
                entries += 0 if segment is None else segment.entries()
            tiers.append(TierStats(tier.name, tier.budget, tier.used_bytes(), entries, self._tier_hits[tier.name]))
        files = [t for t in self._tiers if isinstance(t, FileTier)]
        return CacheStats(
            self._hits,
            self._misses,
            self._stored,
            self._rejected,
            self._corrupt,
            tuple(tiers),
            corrupt_files=sum(t.corrupt_segments for t in files),
            stale_files=sum(t.stale_segments for t in files),
            full_files=sum(t.full_segments for t in files),
        )

    def reset_stats(self) -> None:
        """Zero the counters (occupancy is not touched)."""
        self._hits = self._misses = self._stored = self._rejected = self._corrupt = 0
        self._tier_hits = {tier.name: 0 for tier in self._tiers}

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Lookups inside the block leave the hit and miss counters as they were (for measurements)."""
        saved = (self._hits, self._misses, dict(self._tier_hits))
        try:
            yield
        finally:
            self._hits, self._misses, self._tier_hits = saved

    def flush(self) -> None:
        """Write the disk tier's dirty pages back."""
        for tier in self._tiers:
            if isinstance(tier, FileTier):
                tier.flush()

    def close(self) -> None:
        """Free the device tier and close the file handles; shared files stay for the other processes."""
        self._settle_reads()
        for tier in self._tiers:
            tier.close()

    def unlink(self) -> None:
        """Close, and (leader) delete every shared file of this cache name."""
        for tier in self._tiers:
            for boundary in tier.boundaries():
                tier.drop(boundary)
            tier.close()

    def __enter__(self) -> ActivationCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        policy = "" if c.augmentation is Augmentation.NONE else f", augmentation={c.on_random_augmentation.value}"
        if c.on_random_augmentation is OnRandomAugmentation.VIEWS:
            policy += f"x{c.views}"
        stored = "" if c.storage_dtype is None else f", storage_dtype={c.storage_dtype}"
        return (
            f"ActivationCache(num_samples={c.num_samples}, device={c.device}, budgets=device:{c.device_budget} "
            f"host:{c.host_budget} disk:{c.disk_budget}, name={c.name!r}{policy}{stored})"
        )


def _narrowed(fn: Transform, stored: Callable[[torch.dtype], torch.dtype], values: torch.Tensor) -> torch.Tensor:
    """``fn(values)`` in the dtype the cache stores it in (what :meth:`ActivationCache.extend` writes back)."""
    out = fn(values)
    return out.to(stored(out.dtype))


def _check_layout(segment: Segment, shape: tuple[int, ...], dtype: torch.dtype, boundary: int) -> None:
    if segment.layout.shape != shape or segment.layout.dtype != dtype:
        raise CacheError(
            f"boundary {boundary} holds entries {segment.layout.shape} {segment.layout.dtype}; got rows {shape} {dtype}"
        )


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dim()}-D {value.dtype} tensor"
    return type(value).__name__
