"""Float-robust rounding and the percentile used by the policies (internal).

Why a slack: the schedules are exact rational formulas evaluated in floating point. ``12 * (1 - (2/3) ** 1)`` is
exactly 4 on paper but ``4.000000000000001`` in binary64, and a plain ``ceil`` turns that into 5. The rounding error
of these expressions is a few units in the last place (relative ~1e-15 per operation), so any value within
:data:`SLACK` of an integer is treated as that integer before rounding. The price: an exact value that lies less
than ``SLACK`` above an integer is rounded down - floating point cannot tell such a value from noise anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["SLACK", "ceil_tolerant", "floor_tolerant", "percentile", "reached"]

#: Absolute tolerance for "is this float an integer / has this time been reached". Float noise in the formulas is
#: ~1e-15 relative; 1e-9 leaves six orders of magnitude of headroom for layer counts up to ~1e5.
SLACK = 1e-9


def ceil_tolerant(x: float) -> int:
    """``ceil(x)``, except that values within :data:`SLACK` above an integer round to that integer."""
    return math.ceil(x - SLACK)


def floor_tolerant(x: float) -> int:
    """``floor(x)``, except that values within :data:`SLACK` below an integer round to that integer."""
    return math.floor(x + SLACK)


def reached(now: float, deadline: float) -> bool:
    """``now >= deadline`` up to :data:`SLACK` (a deadline computed as ``0.8 * 10`` is reached at 8)."""
    return now + SLACK >= deadline


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between order statistics.

    Matches ``numpy.percentile``'s default method on finite input, and stays defined when some values are
    infinite (an interpolation between ``inf`` and ``inf`` is ``inf``, not ``nan``).
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    a, b = ordered[lo], ordered[hi]
    if frac == 0.0 or a == b:
        return a
    return a + (b - a) * frac
