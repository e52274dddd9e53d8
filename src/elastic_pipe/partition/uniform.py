"""The ``uniform`` solver: the same number of layers on every stage, whatever they cost.

It is the baseline every other solver is measured against. When ``K`` does not divide ``n``, the ``n mod K``
extra layers go one each to evenly spaced stages (never all onto the last one, which would make it the
bottleneck whenever the layers cost the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elastic_pipe.partition._checks import check_costs, check_stages

__all__ = ["uniform"]


def uniform(costs: Sequence[float], stages: int, /, **options: Any) -> tuple[int, ...]:
    """Split ``len(costs)`` layers into ``stages`` counts that differ by at most one.

    Args:
        costs: per-layer costs (only their number matters).
        stages: number of stages K, ``1 <= K <= len(costs)``.
        **options: ignored (accepted so that every solver takes the same call).

    Returns:
        The number of layers on each stage. With ``r = n mod K``, stage ``s`` gets one extra layer when
        ``(s * r) mod K < r``: exactly ``r`` stages, evenly spaced, starting with the first.
    """
    n = len(check_costs(costs))
    base, extra = divmod(n, check_stages(stages, n))
    return tuple(base + (1 if (s * extra) % stages < extra else 0) for s in range(stages))
