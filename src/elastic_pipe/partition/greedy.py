"""The ``greedy`` solver: PipeTransformer's "parameter-size-wise balance", reproduced exactly.

He et al., "PipeTransformer: Automated Elastic Pipelining for Distributed Training of Transformers", ICML 2021,
section 3.2 and its public code. Users migrating from it compare partitions, so the rule is kept as published,
including its quirks:

* the ``f`` frozen leading entries all go to device 0 and count, on device 0 only, as ``frozen_factor`` of
  their size (1/6 as published);
* device ``i`` takes the not-yet-assigned entries in order while ``size so far + next < mean_i + var_i``, where
  ``mean_i`` is the mean load left per device and ``var_i`` the population variance of the entries left divided
  by the devices left; the last device takes everything left;
* the variance term is not scale-free, so the rule works on sizes divided by ``unit`` (1e6 as published: sizes in
  millions of parameters). Fed raw parameter counts it piles almost everything onto device 0.

The rule can leave a device empty (e.g. with the wrong ``unit``). Every other solver here never does, so by
default that raises :class:`PartitionError`; ``allow_empty=True`` returns the verbatim published output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic_pipe.partition._checks import MAX_DEVICES, check_costs
from elastic_pipe.partition.errors import CHECK, PartitionError
from elastic_pipe.partition.pricing import prices_frozen_itself

__all__ = ["DEFAULT_FROZEN_FACTOR", "PUBLISHED_UNIT", "greedy"]

#: A frozen layer's cost relative to an active one, as published: no gradients, no optimizer state, no activations
#: kept for backward leave about a sixth of a layer's training memory.
DEFAULT_FROZEN_FACTOR = 1.0 / 6.0

#: The published rule's unit: sizes in millions of parameters.
PUBLISHED_UNIT = 1e6


@prices_frozen_itself  # the published rule keeps the frozen entries on device 0, priced there
def greedy(
    costs: Sequence[float],
    stages: int,
    /,
    *,
    frozen: int = 0,
    frozen_factor: float = DEFAULT_FROZEN_FACTOR,
    unit: float = PUBLISHED_UNIT,
    allow_empty: bool = False,
    **options: Any,
) -> tuple[int, ...]:
    """Assign layers to devices with the published PipeTransformer greedy rule.

    Args:
        costs: per-layer sizes (parameter counts as published), in the caller's unit.
        stages: number of devices K.
        frozen: number of frozen leading entries; they all go to device 0.
        frozen_factor: what a frozen entry counts for on device 0, relative to an active one.
        unit: every size is divided by ``unit`` before the rule runs (1e6: the published millions of parameters).
        allow_empty: return the published output even when it leaves a device empty.
        **options: ignored.

    Returns:
        Number of entries on each device.

    Raises:
        PartitionError: on a bad ``frozen``, ``frozen_factor`` or ``unit``, or when a device ends up empty and
            ``allow_empty`` is false.
    """
    costs = check_costs(costs)
    CHECK.int("stages", stages, lo=1, hi=MAX_DEVICES)
    CHECK.number("frozen_factor", frozen_factor)
    CHECK.number("unit", unit)
    n = len(costs)
    CHECK.int("frozen", frozen)
    if isinstance(frozen, bool) or not isinstance(frozen, int) or not 0 <= frozen <= n:
        raise PartitionError(f"frozen must be an int in 0..{n} (the number of layers), got {frozen!r}")
    if not (math.isfinite(frozen_factor) and 0.0 <= frozen_factor <= 1.0):
        raise PartitionError(f"frozen_factor must be in [0, 1], got {frozen_factor!r}")
    if not (math.isfinite(unit) and unit > 0.0):
        raise PartitionError(f"unit must be a finite number > 0, got {unit!r}")
    sizes = [float(c) / unit for c in costs]

    counts = [0] * stages
    loads = [0.0] * stages
    frozen_size = 0.0
    for p in sizes[:frozen]:
        counts[0] += 1
        loads[0] += p
        frozen_size += p
    assigned = frozen
    # Running total of what is left, updated by subtraction in walk order, as published (this fixes the rounding
    # of every comparison, so ties break the same way).
    left = sum(sizes) - loads[0]
    frozen_discount = frozen_size * (1.0 - frozen_factor)

    for device in range(stages):
        devices_left = stages - device
        mean = left / devices_left
        rest = sizes[assigned:]
        variance = float(np.var(rest)) / devices_left if rest else math.nan
        last = device == stages - 1
        for p in rest:
            # Same order of operations as published: (load - discount) + p on device 0, load + p elsewhere.
            criterion = (loads[0] - frozen_discount) + p if device == 0 else loads[device] + p
            if not (last or criterion < mean + variance):
                break
            loads[device] += p
            counts[device] += 1
            assigned += 1
            left -= p

    if not allow_empty and 0 in counts:
        raise PartitionError(
            f"the published greedy rule left stage {counts.index(0)} empty (layers per stage {counts}) with "
            f"unit={unit:g}; sizes are divided by unit before the rule, which expects millions of parameters - "
            "check the unit, use solver 'optimal', or pass allow_empty=True for the verbatim output"
        )
    return tuple(counts)
