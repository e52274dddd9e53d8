"""The byte layout of one cache segment: the entries of one frozen boundary in one tier.

A segment is a slab of ``capacity`` fixed-size slots plus a dense index from key (sample id, times the number of
per-epoch views, plus the view) to slot. Preallocating the slab is what makes a batch one gather or one scatter
instead of a per-sample loop, and a dense index needs no hashing: keys are dataset positions ``0..num_keys-1``.

File segments (host shared memory, disk) lay the same data out in one file so that every process of a node can
map it::

    [0, 4096)           magic b"EPCACHE2", u32 length, JSON header (shape, dtype, capacity, num_keys, checksum,
                        fingerprint), u32 crc32 of everything before it
    [4096, 4104)        int64: slots handed out so far ("used")
    [4104, ...)         int64 index[num_keys]: slot >= 0, ABSENT (-1), or -(slot + 2) for an invalidated slot
    aligned to 64       int32 crc32[capacity] (disk segments only)
    aligned to 64       data[capacity, *shape] in the entry dtype

The header's own crc32 catches a flipped byte there; the ``fingerprint`` (a caller's name for the model whose
prefix produced the entries) tells a stale or foreign file from this cache's own. The index is covered entry by
entry: a disk entry's crc32 is taken over its fingerprint, its key and its data (:func:`entry_seed`), so an index
value that points at another key's slot (flipped, or two entries swapped) fails verification like flipped data.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

import torch

from elastic_pipe.cache.errors import CacheError

__all__ = ["ABSENT", "MAGIC", "SegmentLayout", "decode_invalid", "dtype_from_name", "encode_invalid", "entry_seed"]

#: Format 2: the header carries a fingerprint and a crc32; entry checksums cover their keys.
MAGIC = b"EPCACHE2"
#: Fixed header size: room for the JSON description, and keeps the counters page-aligned.
HEADER_BYTES = 4096
#: Alignment of the checksum and data regions (a cache line; also satisfies every dtype's alignment).
ALIGN = 64
#: Index value of a key that has no entry.
ABSENT = -1
_COUNTER_BYTES = 8
_INDEX_ITEM = 8
_CRC_ITEM = 4
_LEN_BYTES = 4


def entry_seed(fingerprint: str) -> int:
    """The crc32 every entry checksum of a ``fingerprint``'s segment starts from (then the key, then the data)."""
    return zlib.crc32(fingerprint.encode())


def encode_invalid(slots: torch.Tensor) -> torch.Tensor:
    """Index value for slots whose entry failed verification: the slot stays reserved for a rewrite."""
    return -(slots + 2)


def decode_invalid(values: torch.Tensor) -> torch.Tensor:
    """Slot reserved by an invalidated index value (inverse of :func:`encode_invalid`)."""
    return -values - 2


def _align(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def dtype_from_name(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; raises :class:`CacheError` for anything that is not a torch dtype."""
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise CacheError(f"unknown dtype name {name!r} in a cache segment header")
    return value


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """Shape of one segment: what an entry is and how many fit.

    Attributes:
        shape: shape of one entry (one sample's prefix output).
        dtype: entry dtype.
        capacity: number of slots.
        num_keys: size of the key space (samples times views).
        checksum: whether a crc32 per entry is stored and verified (disk segments).
        fingerprint: names the model whose frozen prefix produced the entries (``""``: none given); a file
            with another fingerprint is never read.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    capacity: int
    num_keys: int
    checksum: bool = False
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if any(d < 0 for d in self.shape):
            raise CacheError(f"entry shape must have non-negative sizes, got {self.shape!r}")
        if self.capacity < 0 or self.num_keys < 1 or self.capacity > self.num_keys:
            raise CacheError(
                f"segment needs 0 <= capacity <= num_keys and num_keys >= 1, got capacity={self.capacity}, "
                f"num_keys={self.num_keys}"
            )

    @property
    def entry_bytes(self) -> int:
        """Bytes of one entry."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def index_offset(self) -> int:
        """File offset of the int64 index."""
        return HEADER_BYTES + _COUNTER_BYTES

    @property
    def crc_offset(self) -> int:
        """File offset of the int32 checksums (zero-length region when ``checksum`` is off)."""
        return _align(self.index_offset + _INDEX_ITEM * self.num_keys)

    @property
    def data_offset(self) -> int:
        """File offset of slot 0."""
        crc_bytes = _CRC_ITEM * self.capacity if self.checksum else 0
        return _align(self.crc_offset + crc_bytes)

    @property
    def file_bytes(self) -> int:
        """Size of the whole segment file."""
        return self.data_offset + self.capacity * self.entry_bytes

    def header(self) -> bytes:
        """The 4096-byte header block."""
        body = json.dumps(
            {
                "shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch."),
                "capacity": self.capacity,
                "num_keys": self.num_keys,
                "checksum": self.checksum,
                "fingerprint": self.fingerprint,
            },
            sort_keys=True,
        ).encode()
        block = MAGIC + len(body).to_bytes(_LEN_BYTES, "little") + body
        block += zlib.crc32(block).to_bytes(_CRC_ITEM, "little")
        if len(block) > HEADER_BYTES:
            raise CacheError(
                f"entry shape {self.shape!r} and fingerprint of {len(self.fingerprint)} characters are too long to "
                f"describe in a {HEADER_BYTES}-byte header"
            )
        return block.ljust(HEADER_BYTES, b"\0")

    @classmethod
    def parse(cls, block: bytes) -> SegmentLayout:
        """Read a header block back.

        Raises:
            CacheError: wrong magic, a header checksum that does not match, or a malformed description (a
                corrupted file, or one of another format).
        """
        start = len(MAGIC) + _LEN_BYTES
        if len(block) < start or block[: len(MAGIC)] != MAGIC:
            raise CacheError(f"not an elastic_pipe cache segment of format {MAGIC.decode()} (bad magic)")
        size = int.from_bytes(block[len(MAGIC) : start], "little")
        end = start + size
        if end + _CRC_ITEM > len(block):
            raise CacheError(
                f"cache segment header claims {size} bytes of description; at most {len(block) - start - _CRC_ITEM} fit"
            )
        stored = int.from_bytes(block[end : end + _CRC_ITEM], "little")
        computed = zlib.crc32(block[:end])
        if computed != stored:
            raise CacheError(f"cache segment header fails its crc32 (stored {stored:#010x}, computed {computed:#010x})")
        try:
            meta = json.loads(block[start:end].decode())
            return cls(
                shape=tuple(int(d) for d in meta["shape"]),
                dtype=dtype_from_name(str(meta["dtype"])),
                capacity=int(meta["capacity"]),
                num_keys=int(meta["num_keys"]),
                checksum=bool(meta["checksum"]),
                fingerprint=str(meta["fingerprint"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CacheError(f"malformed cache segment header: {exc}") from None

    @classmethod
    def fitting(
        cls,
        budget_bytes: int,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        num_keys: int,
        *,
        checksum: bool,
        fingerprint: str = "",
    ) -> SegmentLayout:
        """The largest file segment (at most ``num_keys`` slots) whose whole file fits in ``budget_bytes``."""
        empty = cls(shape, dtype, 0, num_keys, checksum, fingerprint)
        per_slot = empty.entry_bytes + (_CRC_ITEM if checksum else 0)
        # an upper bound that ignores the alignment padding; the loop then steps down past the padding
        room = budget_bytes - empty.index_offset - _INDEX_ITEM * num_keys
        capacity = max(0, min(num_keys, room // per_slot if per_slot else num_keys))
        layout = cls(shape, dtype, capacity, num_keys, checksum, fingerprint)
        while layout.capacity > 0 and layout.file_bytes > budget_bytes:
            layout = cls(shape, dtype, layout.capacity - 1, num_keys, checksum, fingerprint)
        return layout
