"""The ``optimal`` solver: the exact minimum of the largest stage cost over contiguous partitions.

Problem: cut non-negative costs ``c[0..n-1]`` into ``K`` contiguous non-empty stages minimising the largest stage
sum (the "bottleneck", which bounds a pipeline's throughput).

Algorithm: bisection on the bottleneck with a greedy probe, made exact by moving both ends of the bracket onto
realised stage sums (the "exact bisection" of Pinar and Aykanat, "Fast optimal load balancing algorithms for 1D
partitioning", JPDC 2004):

* ``probe(B)`` packs stages greedily, each as long as its sum stays <= B, jumping with a binary search over the
  prefix sums: ``O(K log n)``. It is feasible when ``K`` stages cover every layer.
* Feasible: the optimum is at most the largest stage sum the probe actually produced (<= B), so ``hi`` moves
  down to that realised value.
* Infeasible: the greedy outcome stays the same for every bound below the smallest "overflow" (a stage's sum
  plus the next layer), so the optimum is at least that value and ``lo`` moves up to it.

The bracket at least halves per probe and both ends land on stage sums, so the search stops when they meet,
after a few dozen probes. The whole solve is ``O(n + K log n log(range))``; a textbook dynamic programme is
``O(K n^2)``. The partition returned is the greedy one under the optimal bound, with each stage capped so that
every later stage keeps at least one layer: never an empty stage. Costs are summed in float64 prefix sums, so
integer costs are exact and real costs exact up to the rounding of those sums.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic_pipe.partition._checks import check_costs, check_stages
from elastic_pipe.partition.errors import CHECK, PartitionError

__all__ = ["FILLS", "optimal", "optimal_bottleneck", "prefix_sums"]

#: Where :func:`optimal` puts the slack among partitions with the optimal bottleneck.
FILLS = ("front", "back")

#: Safety net against a float rounding stall; a normal solve takes well under 100 probes.
_MAX_PROBES = 400


def prefix_sums(costs: Sequence[float]) -> tuple[list[float], float]:
    """``([0, c0, c0+c1, ...], max cost)``, the sums as Python floats (fast to bisect)."""
    values = np.asarray(costs, dtype=np.float64)
    prefix: list[float] = [0.0]
    prefix.extend(np.cumsum(values).tolist())
    return prefix, float(values.max())


def _probe(prefix: list[float], stages: int, bound: float) -> tuple[bool, float, float]:
    """Greedy packing under ``bound``.

    Returns:
        ``(feasible, largest stage sum produced, smallest overflow)`` where an overflow is a stage's sum plus the
        layer that did not fit (``inf`` when no stage stopped early).
    """
    n = len(prefix) - 1
    start = 0
    largest = 0.0
    overflow = math.inf
    for _ in range(stages):
        base = prefix[start]
        end = bisect_right(prefix, base + bound, start) - 1
        if end >= n:
            return True, max(largest, prefix[n] - base), overflow
        largest = max(largest, prefix[end] - base)
        overflow = min(overflow, prefix[end + 1] - base)
        if end == start:  # a single layer exceeds the bound
            return False, largest, overflow
        start = end
    return False, largest, overflow


def _search(prefix: list[float], largest_layer: float, stages: int) -> tuple[float, float]:
    """Return ``(optimal bottleneck, a bound whose greedy packing realises it)``."""
    n = len(prefix) - 1
    total = prefix[n]
    lo = max(total / stages, largest_layer)
    hi, hi_bound = total, total
    bound = lo
    for _ in range(_MAX_PROBES):
        feasible, largest, overflow = _probe(prefix, stages, bound)
        if feasible:
            if largest < hi:
                hi, hi_bound = largest, bound
            else:  # rounding stalled the bracket: the realised value is as good as it gets
                break
        else:
            lo = max(lo, overflow)
        if lo >= hi:
            break
        bound = lo + (hi - lo) / 2.0
        if not lo < bound < hi:  # adjacent floats: the only candidate left is lo itself
            bound = lo
    return hi, hi_bound


def optimal_bottleneck(costs: Sequence[float], stages: int) -> float:
    """The smallest achievable largest stage sum of ``costs`` cut into ``stages`` contiguous stages.

    Args:
        costs: non-negative per-layer costs.
        stages: number of stages, ``1 <= stages <= len(costs)``.
    """
    prefix, largest_layer = prefix_sums(check_costs(costs))
    return _search(prefix, largest_layer, check_stages(stages, len(costs)))[0]


def optimal(costs: Sequence[float], stages: int, /, *, fill: str = "front", **options: Any) -> tuple[int, ...]:
    """Cut ``costs`` into ``stages`` contiguous non-empty stages with the smallest possible bottleneck.

    Args:
        costs: non-negative per-layer costs.
        stages: number of stages K, ``1 <= K <= len(costs)``.
        fill: which end the slack goes to when several partitions reach the optimum: ``"front"`` packs the early
            stages up to the bottleneck (later stages lighter), ``"back"`` the late ones (useful with 1F1B, whose
            early stages hold the most activations).
        **options: ignored.

    Returns:
        Number of layers on each stage.

    Raises:
        PartitionError: on an unknown ``fill``.
    """
    costs = check_costs(costs)
    check_stages(stages, len(costs))
    if CHECK.str("fill", fill) not in FILLS:
        raise PartitionError(f"unknown fill {fill!r}; valid: {', '.join(FILLS)}")
    if fill == "back":
        return tuple(reversed(optimal(list(costs)[::-1], stages, fill="front")))
    prefix, largest_layer = prefix_sums(costs)
    n = len(prefix) - 1
    if stages == 1:
        return (n,)
    _, bound = _search(prefix, largest_layer, stages)
    counts: list[int] = []
    start = 0
    for stage in range(stages):
        # Greedy under the optimal bound, capped so that each later stage still gets a layer. The cap only ever
        # shortens a stage, after which every later stage is a single layer (each <= the bound): no stage exceeds it.
        cap = n - (stages - stage - 1)
        end = min(bisect_right(prefix, prefix[start] + bound, start) - 1, cap)
        end = max(end, start + 1)
        if stage == stages - 1:
            end = n
        counts.append(end - start)
        start = end
    return tuple(counts)
