"""Input checks shared by the solvers (one place, so every solver rejects bad input with the same words)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from elastic_pipe.partition.errors import CHECK, PartitionError, PartitionTypeError

__all__ = ["MAX_DEVICES", "check_costs", "check_stages"]

#: The most devices (pipeline stages, a device count to divide) a partition or compression takes: beyond any
#: cluster, and it bounds the work a count drives (a stage list, a divisor search).
MAX_DEVICES = 65_536


#: Element types accepted without a per-element check (bool is deliberately absent: True is not a cost).
_PLAIN_NUMBERS = frozenset({int, float, np.float64, np.float32, np.int64, np.int32})


def check_costs(costs: Sequence[float], what: str = "costs") -> list[float]:
    """Return ``costs`` as a list of floats, or raise if any is negative, NaN or infinite, or if there are none."""
    if isinstance(costs, (str, bytes)):
        raise PartitionTypeError(f"{what} must be a sequence of numbers, got a string {costs!r}")
    items = CHECK.items(what, costs, empty=True)
    if not items:
        raise PartitionError(f"{what} is empty: need at least one layer")
    # Fast path (type check and range check at C speed); the slow loop below only runs to name a bad entry.
    if set(map(type, items)) <= _PLAIN_NUMBERS:
        values = np.asarray(items, dtype=np.float64)
        if bool(np.all(np.isfinite(values))) and bool(np.all(values >= 0)):
            return values.tolist()  # type: ignore[no-any-return]
    for index, cost in enumerate(items):
        if isinstance(cost, bool) or not isinstance(cost, (int, float, np.integer, np.floating)):
            raise PartitionTypeError(f"{what}[{index}] must be a number, got {cost!r}")
        value = float(cost)
        if not math.isfinite(value) or value < 0:
            raise PartitionError(f"{what}[{index}] must be a finite number >= 0, got {cost!r}")
    return [float(c) for c in items]


def check_stages(stages: int, num_layers: int) -> int:
    """Return ``stages`` if ``1 <= stages <= num_layers``, else raise naming both."""
    if isinstance(stages, bool) or not isinstance(stages, int):
        raise PartitionTypeError(f"stages must be an int, got {stages!r}")
    if stages < 1:
        raise PartitionError(f"stages must be >= 1, got {stages}")
    CHECK.int("stages", stages, lo=1, hi=MAX_DEVICES)
    if stages > num_layers:
        raise PartitionError(f"cannot cut {num_layers} layers into {stages} non-empty stages (stages > layers)")
    return stages
