"""One entry point for every solver: :func:`solve` and the :data:`SOLVERS` registry.

A solver is any function ``(costs, stages, /, **options) -> layers per stage``. :func:`solve` validates the input
once, prices frozen layers, times the solver alone and wraps its answer in a :class:`Partition`. Whether a solver
prices the frozen layers itself is a flag the solver object carries (:mod:`elastic_pipe.partition.pricing`), so a
solver and its registered name give the same partition.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

from elastic_pipe.partition._checks import check_costs, check_stages
from elastic_pipe.partition.errors import CHECK, PartitionError, PartitionTypeError
from elastic_pipe.partition.graph import graph_chain
from elastic_pipe.partition.greedy import DEFAULT_FROZEN_FACTOR, greedy
from elastic_pipe.partition.optimal import optimal
from elastic_pipe.partition.pricing import PricedSolver, prices_frozen, solver_name
from elastic_pipe.partition.result import Partition, stage_sums
from elastic_pipe.partition.uniform import uniform

__all__ = ["SOLVERS", "Solver", "price_frozen", "register_solver", "solve"]


class Solver(Protocol):
    """A partition solver: a pure function from per-layer costs and a stage count to layers per stage.

    It receives validated costs (finite, >= 0, at least ``stages`` of them) and returns ``stages`` counts summing
    to ``len(costs)`` (stage costs are then the sums of the costs), or a whole :class:`Partition` when its stage
    costs are more than sums (``graph`` adds transfer times).
    """

    def __call__(self, costs: Sequence[float], stages: int, /, **options: Any) -> tuple[int, ...] | Partition: ...


#: Name -> solver. ``graph`` here is the chain form; a DAG with skip connections goes to :func:`graph_partition`.
SOLVERS: dict[str, Solver] = {"uniform": uniform, "greedy": greedy, "optimal": optimal, "graph": graph_chain}


def register_solver(name: str, solver: Solver, *, prices_frozen_itself: bool | None = None) -> None:
    """Add a solver to :data:`SOLVERS` under ``name`` (replacing one of the same name).

    Args:
        name: the name :func:`solve` and the CLI accept.
        solver: the function.
        prices_frozen_itself: pass ``frozen``/``frozen_factor`` to the solver instead of scaling the frozen
            layers' costs before calling it. ``None`` (the default) keeps the solver's own flag
            (:func:`~elastic_pipe.partition.pricing.prices_frozen_itself`, False when unmarked); a value that
            differs registers a :class:`~elastic_pipe.partition.pricing.PricedSolver` carrying it, so
            ``solve(..., SOLVERS[name])`` still prices as ``solve(..., name)``.
    """
    if not name or not isinstance(name, str):
        raise PartitionTypeError(f"solver name must be a non-empty string, got {name!r}")
    CHECK.callable("solver", solver)
    if prices_frozen_itself is not None and prices_frozen_itself != prices_frozen(solver):
        solver = PricedSolver(solver, prices_frozen_itself)
    SOLVERS[name] = solver


def price_frozen(costs: Sequence[float], frozen: int, frozen_factor: float) -> list[float]:
    """Scale the first ``frozen`` costs by ``frozen_factor`` (what a frozen layer costs relative to an active one).

    Raises:
        PartitionError: if ``frozen`` is outside ``0..len(costs)`` or ``frozen_factor`` outside ``[0, 1]``.
    """
    costs = check_costs(costs)
    CHECK.number("frozen_factor", frozen_factor)
    CHECK.int("frozen", frozen)
    if isinstance(frozen, bool) or not isinstance(frozen, int) or not 0 <= frozen <= len(costs):
        raise PartitionError(f"frozen must be an int in 0..{len(costs)} (the number of layers), got {frozen!r}")
    if not (math.isfinite(frozen_factor) and 0.0 <= frozen_factor <= 1.0):
        raise PartitionError(f"frozen_factor must be in [0, 1], got {frozen_factor!r}")
    return [float(c) * frozen_factor for c in costs[:frozen]] + [float(c) for c in costs[frozen:]]


def _lookup(name: str | Solver) -> Solver:
    if callable(name):
        return name
    if not isinstance(name, str):
        raise PartitionTypeError(f"solver must be a solver name or a function, got {name!r}")
    try:
        return SOLVERS[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(SOLVERS))
        raise PartitionError(f"unknown solver {name!r}; valid solvers: {valid}") from None


def solve(
    costs: Sequence[float],
    stages: int,
    solver: str | Solver = "optimal",
    *,
    frozen: int = 0,
    frozen_factor: float = DEFAULT_FROZEN_FACTOR,
    **options: Any,
) -> Partition:
    """Partition per-layer costs into ``stages`` contiguous stages with the named solver.

    Args:
        costs: one non-negative finite cost per layer, in any unit (stage costs come back in the same unit).
        stages: number of stages K, ``1 <= K <= len(costs)``.
        solver: a key of :data:`SOLVERS` ("uniform", "greedy", "optimal", "graph"), or a solver object itself
            (``partition.greedy``), priced as its name is: the flag is the object's own.
        frozen: number of frozen leading layers. A solver that prices them itself (``greedy``: the published
            rule) receives ``frozen`` and ``frozen_factor``; every other solver sees their costs scaled by
            ``frozen_factor`` (and reports stage costs with that pricing).
        frozen_factor: a frozen layer's cost relative to an active one (1/6 as published).
        **options: solver options, e.g. ``unit`` and ``allow_empty`` for ``greedy``, ``activation_bytes`` and
            ``bandwidth`` for ``graph``.

    Returns:
        The partition, with ``solve_seconds`` measuring the solver alone.

    Raises:
        PartitionError: on an unknown solver, bad costs (negative, NaN, infinite, none), or ``stages`` outside
            ``1..len(costs)``.
    """
    fn = _lookup(solver)
    name = solver if isinstance(solver, str) else solver_name(solver)
    values = check_costs(costs)
    check_stages(stages, len(values))
    if prices_frozen(fn):
        options = {**options, "frozen": frozen, "frozen_factor": frozen_factor}
        priced = values
    else:
        priced = price_frozen(values, frozen, frozen_factor)
    start = time.perf_counter()
    answer = fn(priced, stages, **options)
    elapsed = time.perf_counter() - start
    if isinstance(answer, Partition):
        counts, stage_costs = answer.layers_per_stage, answer.stage_costs
    else:
        counts = tuple(int(c) for c in answer)
        stage_costs = ()
    if len(counts) != stages or sum(counts) != len(values) or min(counts) < 0:
        raise PartitionError(
            f"solver {name!r} returned {counts!r}: expected {stages} counts >= 0 summing to {len(values)}"
        )
    return Partition(
        layers_per_stage=counts,
        stage_costs=stage_costs or stage_sums(priced, counts),
        solver=name,
        solve_seconds=elapsed,
    )
