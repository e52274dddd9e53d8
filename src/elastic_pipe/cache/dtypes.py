"""The dtype the cache stores entries in: the values' own (exact), or a narrower floating one (``storage_dtype``)
that halves the bytes per entry, and so the memory, the copies and the disk traffic, for a rounding.

bfloat16 keeps float32's exponent range with 8 significant bits: a stored value's relative error is at most
``2**-8`` (round to nearest: half a unit in the last place). float16 keeps 11 bits (``2**-11``) but overflows
past 65504.
"""

from __future__ import annotations

import torch

from elastic_pipe.cache.errors import CHECK, CacheError, CacheTypeError

__all__ = ["STORAGE_DTYPES", "check_storage_dtype", "parse_storage_dtype", "stored_dtype"]

#: The storage dtypes a cache accepts, by name.
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def parse_storage_dtype(name: str) -> torch.dtype | None:
    """The storage dtype named ``name``; ``"auto"``: ``None`` (the values' own dtype).

    Raises:
        CacheError: an unknown name (the message lists the valid ones).
    """
    if CHECK.str("storage dtype name", name) == "auto":
        return None
    if name not in STORAGE_DTYPES:
        raise CacheError(f"unknown storage dtype {name!r}; expected one of: auto, {', '.join(STORAGE_DTYPES)}")
    return STORAGE_DTYPES[name]


def stored_dtype(given: torch.dtype, storage: torch.dtype | None) -> torch.dtype:
    """The dtype entries put in ``given`` are stored in: ``storage`` where it is a narrower floating dtype than a
    floating ``given``, else ``given`` itself. A storage dtype only narrows: it never widens an entry (no bytes
    saved), converts between dtypes of one width (bfloat16 and float16: a rounding for nothing) or touches integer
    entries (which it could not round-trip).

    Example:
        >>> stored_dtype(torch.float32, torch.bfloat16), stored_dtype(torch.bfloat16, torch.float32)
        (torch.bfloat16, torch.bfloat16)
        >>> stored_dtype(torch.int64, torch.bfloat16)
        torch.int64
    """
    CHECK.instance("given", given, torch.dtype)
    check_storage_dtype(storage)
    if storage is None or not given.is_floating_point or storage.itemsize >= given.itemsize:
        return given
    return storage


def check_storage_dtype(storage: torch.dtype | None) -> None:
    """Refuse a storage dtype that is not a floating one.

    Raises:
        CacheError: naming the dtype.
    """
    if storage is not None and (not isinstance(storage, torch.dtype) or not storage.is_floating_point):
        raise (CacheError if isinstance(storage, torch.dtype) else CacheTypeError)(
            f"storage_dtype must be a floating torch dtype or None, got {storage!r}"
        )
