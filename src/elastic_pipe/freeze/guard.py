"""The held-out guard a statistics-driven policy consults before freezing more (pure, resumable).

It keeps the best held-out loss seen. While the latest one is worse than ``best + tolerance * |best|``, or is not
finite, it *holds*: the policy freezes nothing new. The hold lasts until a later loss comes back within that band.
Freezing cannot be undone (see :mod:`~elastic_pipe.freeze.policy`), so stopping is all a guard can do; it cannot
tell a loss that rises because of freezing from one that rises for any other reason (overfitting, a noisy
evaluation), and then it stops freezing too - it errs towards accuracy.

With ``plateau`` set, it also holds while the held-out loss is still *improving*: a loss more than ``plateau``
(relative) below the best seen before it says the model as a whole is still learning, and a policy should not take
layers out of that learning yet. The first loss holds too (no evidence of a plateau yet). This is the stricter
guard: freezing waits for the held-out metric to flatten.
"""

from __future__ import annotations

import math
from typing import Any

from elastic_pipe.freeze.errors import CHECK, FreezeError

__all__ = ["HeldOutGuard"]


class HeldOutGuard:
    """Stops freezing while the held-out loss is worse than the best seen by more than ``tolerance`` (relative).

    Args:
        tolerance: the guard holds while the loss exceeds ``best + tolerance * |best|``; finite, >= 0. ``None``
            turns the guard off (it never holds).
        owner: the policy's name, for error messages.
        plateau: also hold while the loss is below ``previous best - plateau * |previous best|`` (still improving),
            and on the first loss; None: do not wait for a plateau.

    Raises:
        FreezeError: a ``tolerance`` or ``plateau`` that is negative or not finite, or a plateau without a guard.
    """

    def __init__(self, tolerance: float | None, owner: str = "HeldOutGuard", *, plateau: float | None = None) -> None:
        CHECK.str("owner", owner)
        CHECK.optional_float(f"{owner}: tolerance", tolerance)
        CHECK.optional_float(f"{owner}: plateau", plateau)
        if plateau is not None and tolerance is None:
            raise FreezeError(f"{owner}: plateau={plateau!r} needs the guard on (a tolerance, not None)")
        self.tolerance = None if tolerance is None else float(tolerance)
        self.plateau = None if plateau is None else float(plateau)
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
        before = self.best
        best = loss if before is None else min(before, loss)
        self.best = best
        worse = loss > best + self.tolerance * abs(best)
        improving = self.plateau is not None and (before is None or loss < before - self.plateau * abs(before))
        self.held = worse or improving

    def state_dict(self) -> dict[str, Any]:
        """The best loss (finite or None) and whether the guard holds: plain JSON."""
        return {"best": self.best, "held": self.held}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.best = None if state["best"] is None else float(state["best"])
        self.held = bool(state["held"])
