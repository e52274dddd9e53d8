"""The held-out guard a statistics-driven policy consults before freezing more (pure, resumable).

It keeps the best held-out loss seen. While the latest one is worse than ``best + tolerance * |best|``, or is not
finite, it *holds*: the policy freezes nothing new. The hold lasts until a later loss comes back within that band.
Freezing cannot be undone (see :mod:`~elastic_pipe.freeze.policy`), so stopping is all a guard can do; it cannot
tell a loss that rises because of freezing from one that rises for any other reason (overfitting, a noisy
evaluation), and then it stops freezing too - it errs towards accuracy.
"""

from __future__ import annotations

import math
from typing import Any

from elastic_pipe.freeze.errors import FreezeError

__all__ = ["HeldOutGuard"]


class HeldOutGuard:
    """Stops freezing while the held-out loss is worse than the best seen by more than ``tolerance`` (relative).

    Args:
        tolerance: the guard holds while the loss exceeds ``best + tolerance * |best|``; finite, >= 0. ``None``
            turns the guard off (it never holds).
        owner: the policy's name, for error messages.

    Raises:
        FreezeError: a ``tolerance`` that is negative or not finite.
    """

    def __init__(self, tolerance: float | None, owner: str = "HeldOutGuard") -> None:
        if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0.0):
            raise FreezeError(f"{owner}: tolerance must be a finite number >= 0 or None, got {tolerance!r}")
        self.tolerance = None if tolerance is None else float(tolerance)
        self.best: float | None = None
        self.held = False

    def observe(self, loss: float) -> None:
        """Take in one held-out loss; a loss that is not finite holds and leaves the best as it was."""
        if self.tolerance is None:
            return
        loss = float(loss)
        if not math.isfinite(loss):
            self.held = True
            return
        best = loss if self.best is None else min(self.best, loss)
        self.best = best
        self.held = loss > best + self.tolerance * abs(best)

    def state_dict(self) -> dict[str, Any]:
        """The best loss (finite or None) and whether the guard holds: plain JSON."""
        return {"best": self.best, "held": self.held}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.best = None if state["best"] is None else float(state["best"])
        self.held = bool(state["held"])
