"""Components that resolve but cannot work, for the preflight tests: a solver that is not callable, one that raises."""

from __future__ import annotations

from collections.abc import Sequence

#: What ``[pipeline] solver = "plug_broken:NOT_CALLABLE"`` names: a number, not a function.
NOT_CALLABLE = 42


def broken_solver(costs: Sequence[float], stages: int, **options: object) -> list[int]:
    """A solver that divides by zero on every call."""
    return [len(costs) // 0] * stages
