"""Byte sizes written the way people write them: ``"20GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"4096"``."""

from __future__ import annotations

import re
from decimal import Decimal

from elastic_pipe.cache.errors import CacheError

__all__ = ["UNITS", "parse_bytes"]

#: Accepted units, matched case-insensitively: decimal (kB = 1000) and binary (KiB = 1024). Bare "K", "M" and "G"
#: are refused: half of the tools that accept them mean 1000, the other half 1024.
UNITS: dict[str, int] = {
    "B": 1,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_BY_LOWER = {unit.lower(): factor for unit, factor in UNITS.items()}
_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[a-zA-Z]*)\s*")


def parse_bytes(size: str | int) -> int:
    """The number of bytes in ``size``: an int (returned as is), or a number with an optional unit.

    Args:
        size: e.g. ``"20GiB"``, ``"1.5 GB"``, ``"0"``, ``4096``.

    Returns:
        Bytes, rounded down to a whole byte.

    Raises:
        CacheError: a negative or non-integer int, a malformed string or an unknown unit (the message lists the
            units).

    Example:
        >>> parse_bytes("20GiB"), parse_bytes("1.5kB"), parse_bytes(" 64 MiB ")
        (21474836480, 1500, 67108864)
    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise CacheError(f"a byte size is an int or a string like '20GiB', got {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise CacheError(f"a byte size must be >= 0, got {size}")
        return size
    match = _SIZE.fullmatch(size)
    unit = "b" if match is None or not match["unit"] else match["unit"].lower()
    if match is None or unit not in _BY_LOWER:
        raise CacheError(f"cannot read {size!r} as a byte size; expected a number and one of: {', '.join(UNITS)}")
    return int(Decimal(match["number"]) * _BY_LOWER[unit])
