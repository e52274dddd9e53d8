"""The training runtime's layout rule as one pure function: per-epoch layouts from freeze counts, no cost model.

:func:`runtime_layouts` replays what the elastic runtime decides, epoch by epoch, from the same inputs: the
initial partition of the per-sub-layer costs over ``pipe_len`` stages (:func:`elastic_pipe.partition.solve`), whose
bottleneck is the budget every later stage must respect, and at each decision point (before epochs 1, 2, ...)
the compression rule over the still-active sub-layers (:func:`elastic_pipe.partition.compress_halving`, the
published rule; :func:`elastic_pipe.partition.compress_memory`; or ``"none"``: re-partition at the same length).
A freeze count is capped so that at least one sub-layer per stage stays active when the length cannot shrink
(``"none"``) and at least one sub-layer otherwise, and it never goes down.

This rule balances the costs it is given against the initial bottleneck; it does not predict time or memory.
:func:`elastic_pipe.planner.make_plan` answers a different question - the fastest layout that fits memory under
the planner's cost model - and so may choose other lengths (docs/planner.md, "An epoch").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from elastic_pipe.partition import compress_halving, compress_memory, solve
from elastic_pipe.planner.errors import PlannerError
from elastic_pipe.types import Layout

__all__ = ["COMPRESSIONS", "max_frozen_units", "runtime_layouts"]

#: Compression rules: "halving" (published: halve the pipeline while the halves fit the budget), "memory" (the
#: shortest length dividing the current one whose partition fits the budget), "none" (keep the length).
COMPRESSIONS = ("halving", "memory", "none")


def max_frozen_units(unit_ends: Sequence[int], num_sublayers: int, min_active: int) -> int:
    """The most units that may freeze while at least ``min_active`` sub-layers stay active."""
    best = 0
    for units, end in enumerate(unit_ends, start=1):
        if num_sublayers - end >= min_active:
            best = units
    return best


def _check(costs: Sequence[float], unit_ends: Sequence[int], world_size: int, pipe_len: int, compression: str) -> None:
    if compression not in COMPRESSIONS:
        raise PlannerError(f"unknown compression {compression!r}; expected one of {list(COMPRESSIONS)}")
    if world_size < 1 or pipe_len < 1 or world_size % pipe_len:
        raise PlannerError(f"pipe_len={pipe_len} must be >= 1 and divide world_size={world_size}")
    ends = list(unit_ends)
    if not ends or any(b <= a for a, b in zip([0, *ends], ends, strict=False)) or ends[-1] > len(costs):
        raise PlannerError(
            f"unit_ends must strictly increase within 1..{len(costs)} (the sub-layer count), got {ends!r}"
        )


def runtime_layouts(
    costs: Sequence[float],
    unit_ends: Sequence[int],
    frozen_units: Sequence[int],
    *,
    world_size: int,
    pipe_len: int,
    compression: str = "halving",
    solver: str = "greedy",
    microbatches: int | Callable[[int], int] = 1,
) -> tuple[Layout, ...]:
    """The layout of every epoch as the runtime's rule picks it.

    Args:
        costs: one cost per sub-layer, in the metric the runtime balances (parameter counts, its default, or
            profiled times: ``partition.weights_from_costs(records, "time")``).
        unit_ends: the freezable units as sub-layer end offsets (``SubLayerModel.unit_ends``).
        frozen_units: the freeze policy's unit count per epoch (e.g. ``freeze.frozen_by_epoch(policy, epochs)``);
            epoch 0 runs at the initial layout, so ``frozen_units[0]`` must be 0.
        world_size: ranks of the job; every pipeline length divides it, the rest are replicas.
        pipe_len: the initial pipeline length.
        compression: one of :data:`COMPRESSIONS`.
        solver: the partition solver name (``partition.SOLVERS``).
        microbatches: micro-batches per step and replica, or a function of the pipeline length.

    Returns:
        One :class:`~elastic_pipe.types.Layout` per epoch (``frozen`` counts sub-layers; ``pipe_len``,
        ``replicas``, ``boundaries``, ``microbatches``).

    Raises:
        PlannerError: unknown compression, a length that does not divide the world size, bad ``unit_ends``, an
            empty ``frozen_units`` or one whose first epoch freezes.
        PartitionError: the solver or the compression rule rejects the costs (e.g. more stages than sub-layers).
    """
    _check(costs, unit_ends, world_size, pipe_len, compression)
    if not frozen_units or frozen_units[0] != 0:
        raise PlannerError(
            f"frozen_units needs one count per epoch, starting at 0 (epoch 0 runs at the initial layout), "
            f"got {list(frozen_units)!r}"
        )

    def micro(k: int) -> int:
        return microbatches(k) if callable(microbatches) else microbatches

    start = solve(list(costs), pipe_len, solver)
    budget = float(start.bottleneck)
    layouts = [Layout(0, pipe_len, world_size // pipe_len, tuple(start.boundaries), micro(pipe_len))]
    units_now = 0
    for proposed in frozen_units[1:]:
        current = layouts[-1]
        min_active = current.pipe_len if compression == "none" else 1
        units = max(min(proposed, max_frozen_units(unit_ends, len(costs), min_active)), units_now)
        frozen = unit_ends[units - 1] if units else 0
        if frozen == current.frozen:
            layouts.append(current)
            continue
        active = list(costs[frozen:])
        if compression == "none":
            k, p = current.pipe_len, solve(active, current.pipe_len, solver)
        elif compression == "halving":
            c = compress_halving(active, current.pipe_len, budget, solver=solver)
            k, p = c.pipe_len, c.partition
        else:
            c = compress_memory(active, current.pipe_len, budget, solver=solver)
            k, p = c.pipe_len, c.partition
        if world_size % k:
            raise PlannerError(f"compression chose pipe_len={k}, which does not divide world_size={world_size}")
        boundaries = tuple(frozen + b for b in p.boundaries)
        layouts.append(Layout(frozen, k, world_size // k, boundaries, micro(k)))
        units_now = units
    return tuple(layouts)
