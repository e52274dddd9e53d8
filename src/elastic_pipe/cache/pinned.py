"""Page-locked host slabs for the pinned host tier, registered with CUDA rather than taken from torch's pinned
allocator.

``torch.empty(..., pin_memory=True)`` rounds every request up to a power of two and page-locks it with
``cudaHostAlloc``, which faults the pages in one thread: on one H200 host 21.6 GB took 23.7 s (and 32 GiB were
locked). A pageable tensor touched by torch's own threads (``zero_``) and then registered with
``cudaHostRegister`` took 0.96 s + 0.86 s, locks exactly its size, and copies to and from the GPU as fast
(``benchmarks/gpu/bench_cache_fill_steps_gpu.py``, ``benchmarks/results/gpu_1xh200_cache_fill_steps.json``).
The slab is its own anonymous mapping, left out of forked children (``MADV_DONTFORK``): Linux copies locked pages
into a child at ``fork``, so each DataLoader worker would otherwise hold a copy. Where registration is refused,
the slab falls back to torch's pinned allocator.
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from elastic_pipe.cache.errors import CacheError

__all__ = ["available_bytes", "device_view", "page_locked_empty"]

log = logging.getLogger(__name__)

#: ``cudaHostRegisterPortable | cudaHostRegisterMapped``: page-locked for every CUDA context of the process, and
#: mapped into the devices' address space (with unified addressing the host pointer is the device pointer).
_PORTABLE_MAPPED = 1 | 2


def _cudart() -> Any:
    """torch's binding of the CUDA runtime (looked up at each call, so tests can stand in for it)."""
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _unregister(data: torch.Tensor) -> None:
    _cudart().cudaHostUnregister(data.data_ptr())


def _absorb_error() -> None:
    """Clear the CUDA runtime's last error left by a refused registration (torch's binding returns it without
    clearing it), which the next kernel launch's check would otherwise raise as its own: one tiny launch, whose
    check reads and clears it."""
    if torch.cuda.is_available():
        with contextlib.suppress(RuntimeError):
            torch.zeros(1, device="cuda")


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The memory the host can give without swapping (Linux's ``MemAvailable``), or ``None`` where unknown."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _unforked(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh anonymous memory (page-aligned, its own mapping) that a forked child does not inherit.

    Linux copies a pinned page into a forked child at ``fork`` rather than sharing it copy-on-write, so every
    DataLoader worker forked after the lock would get its own copy of the whole slab (on one H200 host, 8 workers x
    21.6 GB: the job was killed for memory). Workers never read the cache, so the slab is left out of them
    (``MADV_DONTFORK``). The tensor holds the mapping; it is unmapped when the tensor's memory is freed.
    """
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # no POSIX mappings (Windows): no fork either
        return torch.empty(nbytes, dtype=torch.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    dontfork = getattr(mmap, "MADV_DONTFORK", None)
    if dontfork is not None:
        region.madvise(dontfork)
    # Not MADV_HUGEPAGE: on one H200 host (transparent huge pages "madvise", defrag "madvise") 2 MiB pages locked
    # 23 GB in 0.70 s, but touching them (the kernel compacting memory for them) took 6.4 s, longer than a 28.7 GB
    # slab of 4 KiB pages took to make in the training thread (benchmarks/results/gpu_1xh200_disk_data_hugepages.json).
    return torch.frombuffer(region, dtype=torch.uint8)


def page_locked_empty(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, Callable[[], None]]:
    """A page-locked host tensor of ``shape``/``dtype`` (zero-filled) and the call that releases its lock.

    The release holds the tensor, so its memory outlives the lock; it runs once (later calls do nothing). The
    owner calls it when done with the slab, or attaches it to its own lifetime (``weakref.finalize(owner,
    release)``, as :class:`~elastic_pipe.cache.segments.DeviceSegment` does).

    Raises:
        CacheError: more bytes than the host has available (a slab touched beyond that would get the process
            killed for memory, with no message).
    """
    nbytes = math.prod(shape) * dtype.itemsize  # as SegmentLayout.entry_bytes counts it
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, pin_memory=True), lambda: None
    available = available_bytes()
    if available is not None and nbytes > available:  # touching the pages would get the process killed instead
        raise CacheError(
            f"the pinned host tier needs {nbytes} bytes of page-locked memory for this boundary, but the host has "
            f'{available} available (MemAvailable); lower [pipeline] cache_tiers.host or use host_kind = "shared"'
        )
    t0 = time.perf_counter()
    data = _unforked(nbytes).view(dtype).view(shape)
    data.zero_()  # fault the pages in with torch's threads; registering them then only locks them
    t1 = time.perf_counter()
    rc = _cudart().cudaHostRegister(data.data_ptr(), nbytes, _PORTABLE_MAPPED)
    log.debug(
        "pinned host slab of %d bytes: pages touched in %.3f s, locked in %.3f s",
        nbytes,
        t1 - t0,
        time.perf_counter() - t1,
    )
    if int(rc) != 0:  # torch's allocator raises its own error if it cannot lock the memory either
        _absorb_error()
        warnings.warn(
            f"cudaHostRegister refused {nbytes} bytes (CUDA error {int(rc)}); the pinned host tier takes torch's "
            "pinned allocator instead (slower to allocate, rounded up to a power of two)",
            RuntimeWarning,
            stacklevel=2,
        )
        return torch.empty(shape, dtype=dtype, pin_memory=True), lambda: None
    done = [False]

    def unlock() -> None:
        if not done[0]:
            done[0] = True
            _unregister(data)

    return data, unlock


class _MappedBytes:
    """The bytes of a page-locked host tensor, offered to torch as CUDA memory (``__cuda_array_interface__``).

    It holds the host tensor, so the view torch makes of it keeps the memory alive (not the lock: the slab's owner
    drops the view before it releases the lock)."""

    def __init__(self, data: torch.Tensor) -> None:
        self._data = data
        nbytes = data.numel() * data.element_size()
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (data.data_ptr(), False),
            "version": 3,
        }


def device_view(data: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """A tensor on the GPU ``device`` over the same memory as the page-locked host tensor ``data``, or ``None`` where
    there is none (no CUDA, ``data`` not page-locked or not contiguous, or CUDA does not map it).

    A kernel on the view reads the host memory over PCIe itself ("zero-copy"): ``view.index_select(0, slots)`` is
    one gather launched by the host in microseconds, where copying the same rows one run at a time
    (:func:`~elastic_pipe.cache.segments.copy_rows`) costs the host a few microseconds per run. Nothing is copied
    to make the view. The view is valid while ``data`` stays page-locked: drop it before releasing the lock.
    """
    if device.type != "cuda" or not torch.cuda.is_available() or data.device.type != "cpu" or data.numel() == 0:
        return None
    if not data.is_contiguous() or not data.is_pinned():
        return None
    try:  # torch asks CUDA which device the pointer belongs to, and refuses memory that CUDA has not registered
        raw = torch.as_tensor(_MappedBytes(data))  # no device named: naming one could copy instead of alias
    except (RuntimeError, TypeError, ValueError) as err:
        log.debug("no device view of a page-locked slab of %d bytes: %s", data.numel() * data.element_size(), err)
        return None
    wanted = torch.cuda.current_device() if device.index is None else device.index
    if raw.device.type != "cuda" or raw.device.index != wanted or raw.data_ptr() != data.data_ptr():
        return None  # memory CUDA attributes to another device, or not the slab's own bytes: no view
    return raw.view(data.dtype).view(data.shape)
