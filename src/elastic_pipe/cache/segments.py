"""Segments: the entries of one frozen boundary in one tier, as a preallocated slab plus a dense index.

Two kinds share one interface (:class:`Segment`):

* :class:`DeviceSegment`: a tensor on the compute device (GPU memory, or CPU memory for CPU training), private to
  its process;
* :class:`FileSegment`: a memory-mapped file, either in ``/dev/shm`` (host memory shared by the processes of a
  node) or in a directory on disk. Writers take an exclusive ``flock`` on the file and readers a shared one, so a
  reader never sees an index entry whose data is not fully written (``flock`` is a full barrier), and two processes
  that miss the same sample store it once. Disk segments keep a crc32 per entry (over the fingerprint, the key
  and the data) and verify it on every read: a corrupted or truncated entry, or an index value that points at
  another key's slot, is reported as a miss (and recomputed by the caller), never returned.

Every read is one gather (``index_select``) and every write one scatter (``index_copy_``) per segment, whatever the
batch size; only the crc32 check walks the batch's rows, in C.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import uuid
import weakref
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from elastic_pipe.cache.errors import CacheError
from elastic_pipe.cache.layout import (
    ABSENT,
    HEADER_BYTES,
    SegmentLayout,
    decode_invalid,
    encode_invalid,
    entry_seed,
)
from elastic_pipe.cache.pinned import device_view, page_locked_empty

__all__ = [
    "CorruptSegmentError",
    "DeviceSegment",
    "FileSegment",
    "ReadResult",
    "Segment",
    "ShapeChangedError",
    "StaleSegmentError",
    "crc32_rows",
    "index_on",
]

Transform = Callable[[torch.Tensor], torch.Tensor]

#: How a GPU reads a batch from a pinned host slab: ``"mapped"``, one gather kernel on the slab's device view
#: (:func:`~elastic_pipe.cache.pinned.device_view`: the rows cross PCIe as the kernel reads them, the host launches
#: one kernel); ``"copies"``, one DMA copy per run of consecutive slots (:func:`copy_rows`: the host issues every
#: copy). ``"mapped"`` falls back to ``"copies"`` where CUDA gives no device view.
HOST_READS = "mapped"


def _nothing() -> None:
    """The release of a slab that holds no page lock."""


class CorruptSegmentError(CacheError):
    """A segment file whose header or index region is unreadable (bad magic, malformed header, truncated)."""


class StaleSegmentError(CorruptSegmentError):
    """A readable segment file whose fingerprint is not the cache's: another model's (or an older prefix's)
    entries under a reused cache name."""


class ShapeChangedError(CacheError):
    """An in-place transform's output differs in shape or dtype from the stored entries (nothing was written)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one segment returned for a batch of keys.

    Attributes:
        found: bool mask over the requested keys.
        values: the entries of the found keys, in request order, on the requested device.
        corrupt: entries that existed but failed verification (now invalidated, to be recomputed).
    """

    found: torch.Tensor
    values: torch.Tensor
    corrupt: int


class Segment(Protocol):
    """The entries of one boundary in one tier."""

    layout: SegmentLayout

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """Bool mask: which keys have a (not yet invalidated) entry."""
        ...

    def read(self, keys: torch.Tensor, device: torch.device) -> ReadResult:
        """Gather the entries of ``keys`` (one copy) onto ``device``."""
        ...

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Store entries for unique ``keys`` while slots last.

        Returns:
            The mask of keys now present, and how many entries this call wrote (keys another process stored
            first are present but not written again).
        """
        ...

    def valid_keys(self) -> torch.Tensor:
        """Keys with an entry, in slot order."""
        ...

    def transform(self, fn: Transform, batch_size: int, device: torch.device, keep: torch.Tensor | None = None) -> int:
        """Replace every entry ``v`` by ``fn(v)`` in place, ``batch_size`` entries at a time; returns the count.

        ``keep``, a bool mask over the key space, limits the transform to its keys: the other entries are
        invalidated, their slots reserved for a later write of the same key (which reuses the memory).
        """
        ...

    def entries(self) -> int:
        """Number of valid entries."""
        ...

    def nbytes(self) -> int:
        """Bytes the segment reserves."""
        ...

    def close(self) -> None:
        """Release this process's handle."""
        ...


def crc32_rows(values: torch.Tensor, keys: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """crc32 of each row's bytes (``values`` on CPU, first dim = rows), as int32 (the same 32 bits).

    With ``keys`` (one int64 per row), row ``i``'s checksum starts from ``seed`` and covers ``keys[i]``'s eight
    bytes before the row's: an entry checked against another key fails.
    """
    rows = values.contiguous().reshape(values.shape[0], -1)
    raw = rows.view(torch.uint8).numpy()
    if keys is None:
        sums = np.fromiter((zlib.crc32(row, seed) for row in raw), dtype=np.uint32, count=raw.shape[0])
    else:
        key_bytes = keys.to("cpu", torch.int64).numpy().astype("<i8").tobytes()
        starts = (zlib.crc32(key_bytes[8 * i : 8 * i + 8], seed) for i in range(raw.shape[0]))
        pairs = zip(raw, starts, strict=True)
        sums = np.fromiter((zlib.crc32(row, start) for row, start in pairs), np.uint32, raw.shape[0])
    return torch.from_numpy(sums.view(np.int32))


def _assign_slots(
    current: torch.Tensor, used: int, capacity: int, spare: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pick slots for keys whose index values are ``current``.

    Present keys (``>= 0``) keep theirs and are not rewritten; invalidated keys (``<= -2``) get their reserved slot
    back; absent keys (``-1``) take the ``spare`` slots (unclaimed slots below ``used``), then fresh ones while
    ``capacity`` lasts (no eviction: each epoch reads every sample once, so replacing one entry by another never
    raises the hit rate). A reserved slot outside the slab (a damaged file's index) counts as absent.

    Returns:
        (slots per key, -1 where none; mask of keys to write; new ``used`` count).
    """
    slots = torch.full_like(current, ABSENT)
    reserved = decode_invalid(current)
    reuse = (current <= ABSENT - 1) & (reserved < capacity)
    slots[reuse] = reserved[reuse]
    absent = ((current == ABSENT) | ((current <= ABSENT - 1) & ~reuse)).nonzero().flatten()
    spare = torch.empty(0, dtype=current.dtype) if spare is None else spare
    taken = spare[: absent.numel()]
    fresh = min(absent.numel() - taken.numel(), max(0, capacity - used))
    free = torch.cat([taken, torch.arange(used, used + fresh, dtype=current.dtype)])
    slots[absent[: free.numel()]] = free
    write = (current < 0) & (slots >= 0)
    return slots, write, used + fresh


def _claims(index: torch.Tensor, capacity: int) -> torch.Tensor:
    """The slot each key of a file index holds or has reserved, ``-1`` for none (or a value outside the slab)."""
    claimed = torch.where(index <= ABSENT - 1, decode_invalid(index), index)
    return torch.where((claimed >= 0) & (claimed < capacity), claimed, ABSENT)


def index_on(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host index moved to ``device``; to a GPU through pinned memory, which copies without waiting for the work
    queued there (a pageable copy would synchronise the host with the device)."""
    if device.type == "cuda" and index.device.type == "cpu":
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)


def _gather(data: torch.Tensor, slots: torch.Tensor, device: torch.device, *, pinned: bool = False) -> torch.Tensor:
    """``data[slots]`` onto ``device``: one gather on the slab's device, or, from a pinned host slab to a GPU, one
    copy per run of consecutive slots (:func:`copy_rows`); from a pageable host slab to a GPU, through a pinned
    buffer."""
    if data.device.type == "cuda":
        return data.index_select(0, index_on(slots, data.device)).to(device)
    if device.type == "cpu" or data.device.type != "cpu":
        return data.index_select(0, slots.to(data.device)).to(device)
    if pinned:
        out = torch.empty((slots.numel(), *data.shape[1:]), dtype=data.dtype, device=device)
        copy_rows(data, slots, out)
        return out
    staging = torch.empty((slots.numel(), *data.shape[1:]), dtype=data.dtype, pin_memory=True)
    torch.index_select(data, 0, slots, out=staging)
    return staging.to(device, non_blocking=True)


def copy_rows(data: torch.Tensor, slots: torch.Tensor, out: torch.Tensor) -> int:
    """``out[i] = data[slots[i]]``, one copy per run of consecutive slots, issued together in one
    ``torch._foreach_copy_``; returns the number of copies.

    From a pinned host slab to a GPU each copy is a DMA queued on the current stream: no host thread gathers the
    rows into a buffer first, the host only issues the copies (on an H200, a 310 MB batch of 512 random ViT-B/16
    entries: 7.2 ms this way, against 29-42 ms of gather on the host with 16 threads and then 6 ms of copy;
    ``benchmarks/gpu/bench_host_gather_gpu.py``).
    """
    order = slots.tolist()
    n, start = len(order), 0
    targets: list[torch.Tensor] = []
    sources: list[torch.Tensor] = []
    while start < n:
        stop = start + 1
        while stop < n and order[stop] == order[stop - 1] + 1:
            stop += 1
        targets.append(out[start:stop])
        sources.append(data[order[start] : order[stop - 1] + 1])
        start = stop
    if targets:  # one call: the copies are issued in C++, not one Python dispatch each (half the host time)
        torch._foreach_copy_(targets, sources, non_blocking=True)
    return len(targets)


def _run_of(slots: torch.Tensor) -> tuple[int, int] | None:
    """``(first, stop)`` when ``slots`` (host, int64) are ``first, first + 1, ..., stop - 1``, else ``None``."""
    n = slots.numel()
    if n == 0 or slots.device.type != "cpu":
        return None
    first = int(slots[0])
    if first < 0 or int(slots[-1]) != first + n - 1:
        return None
    return (first, first + n) if n == 1 or bool((slots[1:] - slots[:-1] == 1).all()) else None


class DeviceSegment:
    """A slab tensor on the compute device with a CPU index; private to one process (methods as in
    :class:`Segment`)."""

    def __init__(self, layout: SegmentLayout, device: torch.device, *, pin: bool = False) -> None:
        self.layout = layout
        self.device = device
        shape = (layout.capacity, *layout.shape)
        self._unlock: Callable[[], None] = _nothing
        if pin and device.type == "cpu":
            self._data, release = page_locked_empty(shape, layout.dtype)
            self._unlock = weakref.finalize(self, release)
        else:
            self._data = torch.empty(shape, dtype=layout.dtype, device=device, pin_memory=pin)
        self._pinned = pin
        self._mapped: dict[torch.device, torch.Tensor | None] = {}  # the pinned host slab's views on GPUs, by reader
        self._index = torch.full((layout.num_keys,), ABSENT, dtype=torch.int64)
        self._used = 0
        self._landing: torch.cuda.Event | None = None  # the last asynchronous copy into a pinned host slab

    def _settle(self) -> None:
        """Wait for the copies still landing in a pinned host slab (before the host touches the slab)."""
        if self._landing is not None:
            self._landing.synchronize()
            self._landing = None

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        return self._index[keys] >= 0

    def read(self, keys: torch.Tensor, device: torch.device) -> ReadResult:
        slots = self._index[keys]
        found = slots >= 0
        if device.type != "cuda":
            self._settle()
        elif self._landing is not None:  # a GPU reads by DMA: its stream waits for the copies, the host does not
            torch.cuda.current_stream(device).wait_event(self._landing)
        mapped = self._device_view(device)
        if mapped is not None:
            return ReadResult(found, mapped.index_select(0, index_on(slots[found], device)), 0)
        return ReadResult(found, _gather(self._data, slots[found], device, pinned=self._pinned), 0)

    def _device_view(self, device: torch.device) -> torch.Tensor | None:
        """The pinned host slab's view on the GPU ``device`` (:data:`HOST_READS`), made once; ``None`` for a slab
        on the device, a pageable one, or where CUDA gives none."""
        if HOST_READS != "mapped" or not self._pinned or self.device.type != "cpu" or device.type != "cuda":
            return None
        if device not in self._mapped:
            self._mapped[device] = device_view(self._data, device)
        return self._mapped[device]

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, int]:
        current = self._index[keys]
        slots, write, self._used = _assign_slots(current, self._used, self.layout.capacity)
        run = _run_of(slots) if values.shape[1:] == self._data.shape[1:] and values.dtype == self._data.dtype else None
        if run is not None and bool(write.all()):  # fresh consecutive slots (a fill): one copy, no scatter
            # straight into a pinned slab from a GPU: a DMA queued on the current stream, the host not held (a
            # blocking copy waited for the whole step queued before it, every step of the fill)
            landing = self._pinned and values.is_cuda and self.device.type == "cpu"
            self._data[run[0] : run[1]].copy_(values, non_blocking=landing)
            if landing:
                stream = torch.cuda.current_stream(values.device)
                if self._landing is not None:  # one event for every copy still landing, whichever stream queued it
                    stream.wait_event(self._landing)
                self._landing = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch stub
                self._landing.record(stream)
            self._index[keys] = slots
        elif bool(write.all()):  # the usual case (a batch of new keys): no masked select, which would synchronise
            self._settle()  # a host-side write: no copy may still be landing in the rows it reuses
            self._data.index_copy_(0, index_on(slots, self.device), values.to(self.device))
            self._index[keys] = slots
        elif bool(write.any()):
            self._settle()
            target = slots[write]
            rows = values.index_select(0, index_on(write.nonzero().flatten(), values.device))
            self._data.index_copy_(0, index_on(target, self.device), rows.to(self.device))
            self._index[keys[write]] = target
        return (current >= 0) | write, int(write.sum())

    def valid_keys(self) -> torch.Tensor:
        keys = (self._index >= 0).nonzero().flatten()
        return keys[torch.argsort(self._index[keys])]

    def transform(self, fn: Transform, batch_size: int, device: torch.device, keep: torch.Tensor | None = None) -> int:
        self._settle()
        keys = self.valid_keys()
        others = torch.empty(0, dtype=torch.int64)
        if keep is not None:
            keys, others = keys[keep[keys]], keys[~keep[keys]]
        slots = self._index[keys]
        # A pinned host slab carried on a GPU: runs of consecutive slots (a slab filled in order) are views, copied
        # in and out beside the compute; other chunks are gathered into page-locked staging, copied without a
        # pageable bounce (fresh pageable chunks also pay a page fault per 4 KiB), and copied back the same way.
        staged = self.device.type == "cpu" and device.type == "cuda" and self._data.is_pinned()
        starts = range(0, slots.numel(), batch_size)
        runs = [_run_of(slots[start : start + batch_size]) for start in starts]
        if staged:
            _transform_overlapped([self._data[r[0] : r[1]] for r in runs if r is not None], fn, device)
        for start, run in zip(starts, runs, strict=True):
            if run is not None:  # a view: no gather and no scatter (done above when staged)
                if not staged:
                    view = self._data[run[0] : run[1]]
                    new = fn(view.to(device))
                    _check_same(view, new)
                    view.copy_(new)
                continue
            chunk = slots[start : start + batch_size].to(self.device)
            if staged:
                old = torch.empty((chunk.numel(), *self.layout.shape), dtype=self.layout.dtype, pin_memory=True)
                torch.index_select(self._data, 0, chunk, out=old)
                new = fn(old.to(device, non_blocking=True))
                _check_same(old, new)
                back = torch.empty(old.shape, dtype=old.dtype, pin_memory=True)
                back.copy_(new, non_blocking=True)
                torch.cuda.current_stream(device).synchronize()  # ``back`` is read on the host next
                self._data.index_copy_(0, chunk, back)
                continue
            old = self._data.index_select(0, chunk)
            new = fn(old.to(device))
            _check_same(old, new)
            self._data.index_copy_(0, chunk, new.to(self.device))
        self._index[others] = encode_invalid(self._index[others])
        return int(slots.numel())

    def entries(self) -> int:
        return int((self._index >= 0).sum())

    def nbytes(self) -> int:
        return self.layout.capacity * self.layout.entry_bytes

    def close(self) -> None:
        self._settle()
        self._mapped = {}  # no kernel may read the slab through its view once its lock is released
        self._data = torch.empty(0, dtype=self.layout.dtype, device=self.device)
        self._unlock()  # a pinned slab's lock, once nothing here holds it (the caller settled its copies)
        self._index = torch.full((self.layout.num_keys,), ABSENT, dtype=torch.int64)
        self._used = 0


def _transform_overlapped(views: list[torch.Tensor], fn: Transform, device: torch.device) -> None:
    """``fn`` over each view of a pinned host slab on the GPU ``device``, written back in place, with the copies
    beside the compute: chunk ``i + 1`` is copied in on one side stream and chunk ``i - 1`` out on another while
    ``fn`` runs chunk ``i`` on the current stream (serially, the copies of a 21.6 GB slab cost ~1.7 s per move on
    an H200). Returns once every copy back has landed (the slab is read on the host next)."""
    if not views:
        return
    compute = torch.cuda.current_stream(device)
    copy_in = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    copy_out = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def load(view: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        with torch.cuda.stream(copy_in):
            rows = view.to(device, non_blocking=True)
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record(copy_in)
        return rows, ready

    ahead = load(views[0])
    try:
        for i, view in enumerate(views):
            rows, ready = ahead
            if i + 1 < len(views):
                ahead = load(views[i + 1])
            compute.wait_event(ready)
            rows.record_stream(compute)  # allocated on copy_in: not reused while the compute still reads it
            new = fn(rows)
            _check_same(view, new)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(compute)
            copy_out.wait_event(done)
            with torch.cuda.stream(copy_out):
                view.copy_(new, non_blocking=True)
            new.record_stream(copy_out)
    finally:  # also when ``fn`` raised: no copy may still be writing the slab once the caller sees it
        copy_in.synchronize()
        copy_out.synchronize()


def _check_same(old: torch.Tensor, new: torch.Tensor) -> None:
    if new.shape != old.shape or new.dtype != old.dtype:
        raise ShapeChangedError(
            f"transform changed entries from {tuple(old.shape)} {old.dtype} to {tuple(new.shape)} {new.dtype}"
        )


def _reserve_space(fd: int, size: int) -> None:
    """Allocate the file's blocks now, so that a full file system fails here with an ``OSError`` (``ENOSPC``)
    instead of killing the process with ``SIGBUS`` at the first write through the mapping."""
    if size > 0 and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: sparse
                raise


class FileSegment:
    """A segment in one memory-mapped file, shared by every process that opens the same path (methods as in
    :class:`Segment`)."""

    def __init__(self, path: Path, fd: int, layout: SegmentLayout) -> None:
        self.path = path
        self.layout = layout
        self._fd = fd
        self._size = -1
        self._mm: mmap.mmap | None = None
        self._seed = entry_seed(layout.fingerprint)
        self._remap()

    # ----------------------------------------------------------------------------------------- open / create
    @classmethod
    def attach(cls, path: Path, fingerprint: str | None = None) -> FileSegment | None:
        """Open an existing segment file, or return ``None`` if there is none.

        Args:
            path: the segment file.
            fingerprint: the fingerprint the file must carry (``None``: any).

        Raises:
            StaleSegmentError: the file carries another fingerprint.
            CorruptSegmentError: the header or index region is unreadable.
        """
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            layout = SegmentLayout.parse(os.pread(fd, HEADER_BYTES, 0))
        except CacheError as exc:
            os.close(fd)
            raise CorruptSegmentError(f"{path}: {exc}") from None
        if fingerprint is not None and layout.fingerprint != fingerprint:
            os.close(fd)
            raise StaleSegmentError(
                f"{path} holds entries of fingerprint {layout.fingerprint!r}, not this cache's {fingerprint!r}"
            )
        try:
            return cls(path, fd, layout)
        except CacheError as exc:
            os.close(fd)
            raise CorruptSegmentError(f"{path}: {exc}") from None

    @classmethod
    def create_or_attach(cls, path: Path, layout: SegmentLayout) -> FileSegment:
        """Create the segment file with ``layout``, or attach to the one another process created first.

        The file is fully initialized under a temporary name and then hard-linked into place, so no process can
        ever open a half-written header.

        Raises:
            CacheError: an existing file has a different entry shape, dtype, key space or checksum setting.
            StaleSegmentError: an existing file carries another fingerprint.
            CorruptSegmentError: an existing file is unreadable.
        """
        existing = cls.attach(path, layout.fingerprint)
        if existing is None:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, layout.file_bytes)
                _reserve_space(fd, layout.file_bytes)
                os.pwrite(fd, layout.header(), 0)
                # int64 -1 is all 0xff bytes: every key starts ABSENT.
                os.pwrite(fd, b"\xff" * (8 * layout.num_keys), layout.index_offset)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    os.close(fd)
                    existing = cls.attach(path, layout.fingerprint)
                else:
                    return cls(path, fd, layout)
            except BaseException:
                if existing is None:
                    os.close(fd)
                raise
            finally:
                tmp.unlink(missing_ok=True)
        if existing is None:  # the winner of the race deleted it again already
            return cls.create_or_attach(path, layout)
        found = existing.layout
        if (found.shape, found.dtype, found.num_keys, found.checksum) != (
            layout.shape,
            layout.dtype,
            layout.num_keys,
            layout.checksum,
        ):
            existing.close()
            raise CacheError(
                f"cache segment {path} holds entries {found.shape} {found.dtype} for {found.num_keys} keys "
                f"(checksum={found.checksum}); expected {layout.shape} {layout.dtype} for {layout.num_keys} keys "
                f"(checksum={layout.checksum}); use another cache name or delete the file"
            )
        return existing

    # ----------------------------------------------------------------------------------------- mapping
    def _remap(self) -> None:
        """(Re)map the file at its current size; slots past the end of a truncated file become unreadable."""
        size = os.fstat(self._fd).st_size
        if size == self._size:
            return
        if size < self.layout.data_offset:
            raise CorruptSegmentError(
                f"{self.path}: file is {size} bytes, shorter than its index ({self.layout.data_offset} bytes)"
            )
        self._drop_views()
        self._mm = mmap.mmap(self._fd, size)
        u8 = torch.from_numpy(np.frombuffer(self._mm, dtype=np.uint8))
        lay = self.layout
        self._used_view = u8[HEADER_BYTES : HEADER_BYTES + 8].view(torch.int64)
        self._index = u8[lay.index_offset : lay.index_offset + 8 * lay.num_keys].view(torch.int64)
        self._crc = u8[lay.crc_offset : lay.crc_offset + 4 * lay.capacity].view(torch.int32)
        readable = min(lay.capacity, (size - lay.data_offset) // lay.entry_bytes)
        raw = u8[lay.data_offset : lay.data_offset + readable * lay.entry_bytes]
        self._data = raw.view(lay.dtype).view(readable, *lay.shape)
        self._size = size

    def _drop_views(self) -> None:
        for name in ("_used_view", "_index", "_crc", "_data"):
            if hasattr(self, name):
                delattr(self, name)
        if self._mm is not None:
            # BufferError: a caller still holds a view; the mapping goes when that view does
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            self._remap()
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def is_current(self) -> bool:
        """Whether ``path`` still names the file this handle has open (not dropped, renamed or replaced)."""
        try:
            return os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except (FileNotFoundError, OSError):
            return False

    # ----------------------------------------------------------------------------------------- entries
    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        with self._locked(exclusive=False):
            return self._index[keys] >= 0

    def read(self, keys: torch.Tensor, device: torch.device) -> ReadResult:
        with self._locked(exclusive=False):
            slots = self._index[keys].clone()
            found = slots >= 0
            readable = found & (slots < self._data.shape[0])
            values = _gather(self._data, slots[readable], torch.device("cpu") if self.layout.checksum else device)
            good = torch.ones(values.shape[0], dtype=torch.bool)
            if self.layout.checksum and values.shape[0]:
                good = crc32_rows(values, keys[readable], self._seed) == self._crc[slots[readable]]
        bad = found.clone()
        bad[readable.nonzero().flatten()[good]] = False
        corrupt = int(bad.sum())
        if corrupt:
            self._invalidate(keys[bad], slots[bad])
            values = values[good]
        if self.layout.checksum:
            values = values.to(device)
        return ReadResult(found & ~bad, values, corrupt)

    def _invalidate(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Mark entries unusable (keep their slots for a rewrite), unless another process rewrote them already."""
        with self._locked(exclusive=True):
            still = self._index[keys] == slots
            self._reserve(keys[still], slots[still])

    def _reserve(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Invalidate ``keys`` (under the exclusive lock), each keeping its slot for a rewrite only if no other key
        claims that slot: an entry that failed verification may have been reached through a damaged index value,
        and rewriting another key's slot would make the two evict each other forever. Those keys become absent;
        the slot their entry really had is unclaimed now and :meth:`write` hands it out again."""
        if keys.numel() == 0:
            return
        capacity = self.layout.capacity
        claims = _claims(self._index, capacity)
        claims[keys] = ABSENT
        taken = torch.bincount(claims[claims >= 0], minlength=capacity) > 0
        inside = (slots >= 0) & (slots < capacity)
        mine = inside.clone()
        mine[inside] = ~taken[slots[inside]]
        _, first = np.unique(slots.numpy(), return_index=True)  # two damaged keys on one slot: the first keeps it
        unique = torch.zeros_like(mine)
        unique[torch.from_numpy(first)] = True
        mine &= unique
        self._index[keys[mine]] = encode_invalid(slots[mine])
        self._index[keys[~mine]] = ABSENT

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, int]:
        with self._locked(exclusive=True):
            if self._size < self.layout.file_bytes:  # truncated: grow back so that every slot is writable
                os.ftruncate(self._fd, self.layout.file_bytes)
                self._remap()
            current = self._index[keys].clone()
            used, spare = min(max(int(self._used_view[0]), 0), self.layout.capacity), None
            if self.layout.checksum and bool(((current < 0) & (_claims(current, self.layout.capacity) < 0)).any()):
                used, spare = self._free_slots(used)  # disk: verified against the index
            slots, write, used = _assign_slots(current, used, self.layout.capacity, spare)
            if bool(write.any()):
                target = slots[write]
                rows = values[write.to(values.device)].to("cpu").contiguous()
                self._data.index_copy_(0, target, rows)
                if self.layout.checksum:
                    self._crc[target] = crc32_rows(rows, keys[write], self._seed)
                # the data is written before the index entry that publishes it
                self._index[keys[write]] = target
                self._used_view[0] = used
            return (current >= 0) | write, int(write.sum())

    def _free_slots(self, used: int) -> tuple[int, torch.Tensor]:
        """The slot counter checked against the index, and the unclaimed slots below it (under the lock).

        The counter and the index live in one file that may be damaged: a counter below a claimed slot would hand
        that slot out again, and an entry whose index value was lost leaves its slot unclaimed for good. One pass
        over the index settles both; disk segments (the checked ones) pay it on writes of new keys.
        """
        capacity = self.layout.capacity
        claims = _claims(self._index, capacity)
        used = min(max(used, int(claims.max()) + 1 if claims.numel() else 0), capacity)
        taken = torch.bincount(claims[claims >= 0], minlength=capacity)[:used] > 0
        return used, (~taken).nonzero().flatten()

    def valid_keys(self) -> torch.Tensor:
        with self._locked(exclusive=False):
            keys = (self._index >= 0).nonzero().flatten()
            return keys[torch.argsort(self._index[keys])]

    def transform(self, fn: Transform, batch_size: int, device: torch.device, keep: torch.Tensor | None = None) -> int:
        done = 0
        with self._locked(exclusive=True):
            keys = (self._index >= 0).nonzero().flatten()
            keys = keys[torch.argsort(self._index[keys])]
            others = torch.empty(0, dtype=torch.int64)
            if keep is not None:
                keys, others = keys[keep[keys]], keys[~keep[keys]]
            slots = self._index[keys].clone()
            lost = slots >= self._data.shape[0]  # past the end of a truncated file
            self._reserve(keys[lost], slots[lost])
            keys, slots = keys[~lost], slots[~lost]
            for start in range(0, slots.numel(), batch_size):
                chunk, chunk_keys = slots[start : start + batch_size], keys[start : start + batch_size]
                old = self._data.index_select(0, chunk)
                if self.layout.checksum:
                    good = crc32_rows(old, chunk_keys, self._seed) == self._crc[chunk]
                    self._reserve(chunk_keys[~good], chunk[~good])
                    chunk, chunk_keys, old = chunk[good], chunk_keys[good], old[good]
                    if chunk.numel() == 0:
                        continue
                new = fn(old.to(device))
                _check_same(old, new)
                rows = new.to("cpu").contiguous()
                self._data.index_copy_(0, chunk, rows)
                if self.layout.checksum:
                    self._crc[chunk] = crc32_rows(rows, chunk_keys, self._seed)
                done += int(chunk.numel())
            self._index[others] = encode_invalid(self._index[others])
        return done

    def entries(self) -> int:
        with self._locked(exclusive=False):
            return int((self._index >= 0).sum())

    def nbytes(self) -> int:
        return self.layout.file_bytes

    def rename(self, path: Path) -> None:
        """Move the file to ``path`` (replacing any file there), under the exclusive lock."""
        with self._locked(exclusive=True):
            os.replace(self.path, path)
            self.path = path

    def flush(self) -> None:
        """Write dirty pages back to the file (disk durability; a no-op cost on tmpfs)."""
        if self._mm is not None:
            self._mm.flush()

    def close(self) -> None:
        self._drop_views()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        # at interpreter shutdown the modules close() needs may already be gone
        with contextlib.suppress(Exception):
            self.close()

    def destroy(self) -> None:
        """Delete the file (if it is still this one) and close the handle; other processes' mappings stay valid
        until they close theirs, and the memory returns to the system then."""
        if self.is_current():
            self.path.unlink(missing_ok=True)
        self.close()
