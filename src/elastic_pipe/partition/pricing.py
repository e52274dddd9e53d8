"""How a solver prices frozen layers, carried by the solver object itself.

:func:`~elastic_pipe.partition.registry.solve` either scales the frozen layers' costs before calling a solver
(:func:`~elastic_pipe.partition.registry.price_frozen`), or passes ``frozen``/``frozen_factor`` to a solver that
prices them itself (``greedy``: the published rule keeps them all on device 0). The flag lives on the solver, not on
the name it is registered under, so ``solve(costs, k, "greedy", frozen=f)`` and ``solve(costs, k, greedy, frozen=f)``
give the same partition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from elastic_pipe.partition.errors import CHECK

__all__ = ["PRICES_FROZEN_ITSELF", "PricedSolver", "prices_frozen", "prices_frozen_itself", "solver_name"]

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute a solver sets to ``True`` when it prices the frozen layers itself.
PRICES_FROZEN_ITSELF = "prices_frozen_itself"


def prices_frozen_itself(solver: F) -> F:
    """Mark ``solver`` (a function, decorated) as pricing the frozen layers itself; returns it."""
    CHECK.callable("solver", solver)
    setattr(solver, PRICES_FROZEN_ITSELF, True)
    return solver


def prices_frozen(solver: object) -> bool:
    """Whether ``solver`` prices the frozen layers itself: its ``prices_frozen_itself`` attribute, False if absent."""
    return getattr(solver, PRICES_FROZEN_ITSELF, False) is True


@dataclass(frozen=True)
class PricedSolver:
    """A solver with its frozen-pricing flag set by whoever registered it (``register_solver(...,
    prices_frozen_itself=...)``), leaving the function itself unmarked.

    Attributes:
        solver: the solver function.
        prices_frozen_itself: pass ``frozen``/``frozen_factor`` to it instead of scaling the frozen costs first.
    """

    solver: Callable[..., Any]
    prices_frozen_itself: bool

    def __call__(self, costs: Sequence[float], stages: int, /, **options: Any) -> Any:
        """Run the solver."""
        return self.solver(costs, stages, **options)


def solver_name(solver: object) -> str:
    """A solver object's name for a :class:`~elastic_pipe.partition.result.Partition` (its function's name)."""
    inner = solver.solver if isinstance(solver, PricedSolver) else solver
    return str(getattr(inner, "__name__", type(inner).__name__))
