"""Tiers: a byte budget and the segments (one per frozen boundary) that live within it.

* :class:`DeviceTier`: tensors on the compute device, private to the process (also the pinned host tier:
  page-locked CPU tensors);
* :class:`FileTier`: segment files in one directory. In ``/dev/shm`` it is the host tier, shared by every process of
  the node that uses the same cache name; in a disk directory (with checksums) it is the disk tier.

A segment's size is fixed when it is created: as many slots as the tier's remaining budget allows (at most one per
key). For a file tier the remaining budget counts every segment file of the cache name, whichever process made it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import TypeAlias

import torch

from elastic_pipe.cache.errors import CacheDirError
from elastic_pipe.cache.layout import SegmentLayout
from elastic_pipe.cache.segments import CorruptSegmentError, DeviceSegment, FileSegment, Segment, StaleSegmentError

__all__ = ["DeviceTier", "FileTier", "Tier", "check_writable"]

log = logging.getLogger(__name__)


def check_writable(tier: str, directory: Path) -> None:
    """Create ``directory`` if needed and write (then delete) a probe file in it.

    Raises:
        CacheDirError: the directory cannot be created or written (names the tier and the path).
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".elastic_pipe-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CacheDirError(tier, str(directory), exc.strerror or str(exc)) from None


class DeviceTier:
    """Segments as tensors on ``device``, within ``budget`` bytes of entry data; with ``pin``, page-locked CPU
    tensors (the pinned host tier)."""

    def __init__(
        self, budget: int, device: torch.device, num_keys: int, *, name: str = "device", pin: bool = False
    ) -> None:
        self.name = name
        self.budget = budget
        self.device = device
        self.pin = pin
        self.num_keys = num_keys
        self._segments: dict[int, DeviceSegment] = {}

    def segment(self, boundary: int) -> Segment | None:
        """The segment of ``boundary``, if any."""
        return self._segments.get(boundary)

    def _fitting(self, shape: tuple[int, ...], dtype: torch.dtype, most: int | None = None) -> SegmentLayout | None:
        """The layout of a new segment sized to the remaining budget (at most ``most`` entries, one per key
        without it), or ``None`` if not one entry fits."""
        entry = SegmentLayout(shape, dtype, 0, self.num_keys).entry_bytes
        cap = self.num_keys if most is None else min(self.num_keys, most)
        capacity = min(cap, max(0, self.budget - self.used_bytes()) // max(entry, 1))
        return SegmentLayout(shape, dtype, capacity, self.num_keys) if capacity > 0 else None

    def create(
        self, boundary: int, shape: tuple[int, ...], dtype: torch.dtype, *, most: int | None = None
    ) -> Segment | None:
        """A new segment for ``boundary`` sized to the remaining budget, at most ``most`` entries (the keys the
        tiers before this private one cannot hold; one per key without it), or ``None`` if not one entry fits.

        Raises:
            CacheError: the host cannot give a pinned slab that much memory.
        """
        layout = self._fitting(shape, dtype, most)
        if layout is None:
            return None
        segment = DeviceSegment(layout, self.device, pin=self.pin)
        self._segments[boundary] = segment
        return segment

    def capacity_for(self, boundary: int, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Entries of ``shape``/``dtype`` a segment of ``boundary`` holds here: an existing one's slots, else what
        :meth:`create` would give now."""
        existing = self._segments.get(boundary)
        if existing is not None:
            return existing.layout.capacity
        layout = self._fitting(shape, dtype)
        return 0 if layout is None else layout.capacity

    def scratch(self, layout: SegmentLayout) -> Segment:
        """A segment outside the budget and the boundaries, of this tier's kind (for timing reads)."""
        return DeviceSegment(layout, self.device, pin=self.pin)

    def drop(self, boundary: int) -> int:
        """Free the segment of ``boundary``; returns the bytes returned to the budget."""
        segment = self._segments.pop(boundary, None)
        if segment is None:
            return 0
        freed = segment.nbytes()
        segment.close()
        return freed

    def rename(self, old: int, new: int) -> None:
        """Relabel the entries of ``old`` as ``new`` (after an in-place extension)."""
        self.drop(new)
        if old in self._segments:
            self._segments[new] = self._segments.pop(old)

    def boundaries(self) -> list[int]:
        """Boundaries with a segment here."""
        return sorted(self._segments)

    def used_bytes(self) -> int:
        """Bytes reserved by this process's segments."""
        return sum(s.nbytes() for s in self._segments.values())

    def close(self) -> None:
        """Free everything."""
        for boundary in list(self._segments):
            self.drop(boundary)


class FileTier:
    """Segment files ``<directory>/<prefix>.b<boundary>.slab`` within ``budget`` bytes of files.

    Every process of the node opens the same files. Only the ``leader`` deletes or renames them (on
    :meth:`drop` and :meth:`rename`); the others just let go of their handles. Every file carries the cache's
    ``fingerprint``; one that carries another (a stale or foreign cache under the same name) or whose header fails
    its checksum is deleted, counted, and its entries recomputed: it is never read.
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        prefix: str,
        budget: int,
        num_keys: int,
        *,
        checksum: bool,
        leader: bool,
        fingerprint: str = "",
    ) -> None:
        self.name = name
        self.directory = directory
        self.prefix = prefix
        self.budget = budget
        self.num_keys = num_keys
        self.checksum = checksum
        self.leader = leader
        self.fingerprint = fingerprint
        #: Files deleted because their header or index region was unreadable.
        self.corrupt_segments = 0
        #: Files deleted because they carried another fingerprint.
        self.stale_segments = 0
        #: Segments that could not be created because the file system refused the space (full, quota).
        self.full_segments = 0
        self._open: dict[int, FileSegment] = {}

    def path(self, boundary: int) -> Path:
        """The file of ``boundary``'s segment."""
        return self.directory / f"{self.prefix}.b{boundary}.slab"

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob(f"{self.prefix}.b*.slab"))

    def segment(self, boundary: int) -> Segment | None:
        """This process's handle on ``boundary``'s file, (re)attached if another process created or replaced it.

        An unreadable file (corrupt header or index) is deleted and reported as absent, so its entries are
        recomputed.
        """
        handle = self._open.get(boundary)
        if handle is not None:
            if handle.is_current():
                return handle
            handle.close()
            del self._open[boundary]
        path = self.path(boundary)
        try:
            handle = FileSegment.attach(path, self.fingerprint)
        except CorruptSegmentError as exc:
            self._discard(path, exc)
            return None
        if handle is not None:
            self._open[boundary] = handle
        return handle

    def create(
        self, boundary: int, shape: tuple[int, ...], dtype: torch.dtype, *, most: int | None = None
    ) -> Segment | None:
        """Create (or attach to) ``boundary``'s file, sized to the budget left by the other segment files.

        ``most`` is not applied: the file is shared by the node's processes, and holds what any of them misses
        (their private tiers before it hold different keys).
        """
        others = self.used_bytes(excluding=self.path(boundary))
        layout = SegmentLayout.fitting(
            self.budget - others, shape, dtype, self.num_keys, checksum=self.checksum, fingerprint=self.fingerprint
        )
        if layout.capacity == 0:
            return None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                handle = FileSegment.create_or_attach(self.path(boundary), layout)
            except CorruptSegmentError as exc:
                self._discard(self.path(boundary), exc)
                handle = FileSegment.create_or_attach(self.path(boundary), layout)
        except OSError as exc:
            # A full (or failing) file system: no segment here, so the entries spill to the next tier or are
            # recomputed when a step needs them. Training goes on; the count and the warning say why it slowed.
            self.full_segments += 1
            log.warning(
                "activation cache: cannot create a %d-byte %s segment in %s (%s); its entries are not cached here "
                "and are recomputed when needed",
                layout.file_bytes,
                self.name,
                self.directory,
                exc.strerror or exc,
            )
            return None
        self._open[boundary] = handle
        return handle

    def capacity_for(self, boundary: int, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        """Entries of ``shape``/``dtype`` a segment file of ``boundary`` holds here: what :meth:`create` would
        size it to now, within the budget the other segment files leave."""
        others = self.used_bytes(excluding=self.path(boundary))
        layout = SegmentLayout.fitting(
            self.budget - others, shape, dtype, self.num_keys, checksum=self.checksum, fingerprint=self.fingerprint
        )
        return layout.capacity

    def scratch(self, layout: SegmentLayout) -> Segment:
        """A private segment file of this tier's kind (checksummed on disk), outside the budget, deleted when
        closed (for timing reads)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f".{self.prefix}.scratch-{os.getpid()}-{uuid.uuid4().hex[:8]}.slab"
        checked = SegmentLayout(
            layout.shape, layout.dtype, layout.capacity, layout.num_keys, self.checksum, self.fingerprint
        )
        segment = FileSegment.create_or_attach(path, checked)
        path.unlink()  # the mapping stays valid; nothing is left behind if the process dies
        return segment

    def _discard(self, path: Path, exc: CorruptSegmentError) -> None:
        if isinstance(exc, StaleSegmentError):
            self.stale_segments += 1
        else:
            self.corrupt_segments += 1
        path.unlink(missing_ok=True)

    def drop(self, boundary: int) -> int:
        """Let go of ``boundary``'s file; the leader also deletes it. Returns the bytes freed (leader) or 0."""
        handle = self._open.pop(boundary, None)
        if handle is not None:
            handle.close()
        if not self.leader:
            return 0
        path = self.path(boundary)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return 0
        path.unlink(missing_ok=True)
        return size

    def rename(self, old: int, new: int) -> None:
        """Leader: move ``old``'s file to ``new`` (replacing it). Everyone: drop the stale handles."""
        for boundary in (old, new):
            handle = self._open.pop(boundary, None)
            if handle is not None:
                handle.close()
        if self.leader and self.path(old).exists():
            os.replace(self.path(old), self.path(new))

    def boundaries(self) -> list[int]:
        """Boundaries with a segment file (made by any process)."""
        found = []
        for p in self._files():
            tail = p.name[len(self.prefix) + 2 : -len(".slab")]
            if tail.isdigit():
                found.append(int(tail))
        return sorted(found)

    def used_bytes(self, excluding: Path | None = None) -> int:
        """Bytes of every segment file of the cache name but ``excluding`` (logical size: tmpfs allocates pages
        when they are first touched)."""
        total = 0
        for p in self._files():
            if p == excluding:
                continue
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                continue
        return total

    def flush(self) -> None:
        """Write this process's dirty pages back."""
        for handle in self._open.values():
            handle.flush()

    def close(self) -> None:
        """Close this process's handles (files stay)."""
        for handle in self._open.values():
            handle.close()
        self._open.clear()


#: Any tier the cache stacks (device first, then host, then disk).
Tier: TypeAlias = DeviceTier | FileTier
