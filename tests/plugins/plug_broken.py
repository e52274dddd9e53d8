"""Components that resolve but cannot work, for the preflight tests: a solver that is not callable, one that raises."""

from __future__ import annotations

from collections.abc import Sequence

#: What ``[pipeline] solver = "plug_broken:NOT_CALLABLE"`` names: a number, not a function.
NOT_CALLABLE = 42


def broken_solver(costs: Sequence[float], stages: int, **options: object) -> list[int]:
    """A solver that divides by zero on every call."""
    return [len(costs) // 0] * stages


class BrokenRule:
    """A compression rule with every member, whose call fails (at a run's first decision point)."""

    name = "broken"
    keeps_length = False

    def __call__(self, active: Sequence[float], pipe_len: int, budget: float, **options: object) -> object:
        raise KeyError(f"no rule for {pipe_len} stages")


#: What ``[pipeline] compression = "plug_broken:BROKEN_RULE"`` names.
BROKEN_RULE = BrokenRule()


def undecided(epoch: int, step: int, current: int) -> int:
    """A policy function that raises when asked (at a run's first decision point)."""
    raise ValueError(f"no opinion at epoch {epoch}")
