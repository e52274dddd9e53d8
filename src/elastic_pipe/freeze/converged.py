"""Freeze a layer only once the evidence says it has converged (registry name ``"converged"``).

The signal is AutoFreeze's (Liu et al., "AutoFreeze: Automatically Freezing Model Blocks to Accelerate
Fine-tuning", 2021): how much a layer's gradient norm changes from one interval to the next. AutoFreeze compares
it with a percentile of the active layers' changes, so it freezes at every decision whether or not any layer has
settled. This policy asks for absolute, lasting evidence instead and freezes slowly::

    n_l(t)    = L2 norm of layer l's mean gradient over interval t          (LayerStats.mean_l2)
    r_l(t)    = |n_l(t) - n_l(t-1)| / n_l(t-1)                            (0 for 0 -> 0, inf for 0 -> x > 0)
    streak_l  = consecutive observations with r_l < threshold               (reset to 0 by any other one)
    ready     = leading active layers current, current+1, ... with streak >= patience, stopping at the first other
    proposal  = current + min(ready, max_step, cap - current)               cap = floor(max_fraction * L)

Only a contiguous prefix is frozen: a converged layer behind one that is still moving waits for it. One decision
per observation: without statistics since the previous :meth:`Converged.propose`, nothing new is frozen.

The held-out guard: :meth:`Converged.observe_eval` keeps the best held-out loss seen. While the latest one is worse
than ``best + tolerance * |best|`` (or not finite), the policy freezes nothing new; the hold lasts until a later
loss comes back within that band. Freezing cannot be undone (see :mod:`~elastic_pipe.freeze.policy`), so stopping
is all a guard can do. ``tolerance=None`` turns it off.

Every default leans towards accuracy rather than speed; the module constants say why each was chosen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from elastic_pipe.freeze._observed import check_stats, norms_from_state, norms_to_state
from elastic_pipe.freeze.autofreeze import change_ratios
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_num_layers
from elastic_pipe.freeze.stats import LayerStats
from elastic_pipe.freeze.streaks import StreakPolicy, check_max_fraction, converged_prefix, max_frozen

__all__ = [
    "DEFAULT_MAX_FRACTION",
    "DEFAULT_MAX_STEP",
    "DEFAULT_PATIENCE",
    "DEFAULT_THRESHOLD",
    "DEFAULT_TOLERANCE",
    "Converged",
    "check_max_fraction",
    "converged_prefix",
    "max_frozen",
    "next_streaks",
]

#: A change of less than 5% in a layer's mean-gradient norm between intervals counts as quiet. Small on purpose: a
#: layer whose gradient still visibly moves is still learning, and freezing it early is what costs accuracy.
DEFAULT_THRESHOLD = 0.05

#: Quiet intervals in a row before a layer counts as converged. One is not enough: where a norm curve turns (its
#: maximum while a layer starts learning, or a bump), the change between two intervals is briefly small. Three in
#: a row rule out a single turning point and a lucky pair.
DEFAULT_PATIENCE = 3

#: At most three quarters of the layers are ever frozen, so the last quarter (at least the last layer when L >= 2;
#: nothing when L = 1) keeps training. The layers next to the head carry the task-specific features; they adapt
#: most in fine-tuning and are where the schedules that freeze everything lose accuracy (docs/freeze.md).
DEFAULT_MAX_FRACTION = 0.75

#: One new layer per decision, so the next interval's held-out loss shows the effect of each freeze (and the guard
#: can stop) before another layer goes.
DEFAULT_MAX_STEP = 1

#: The guard holds once the held-out loss is more than 1% (relative) above the best seen. Relative, so that it does
#: not depend on the loss's scale; 1% rather than 0, so that the jitter of a plateaued loss does not hold freezing
#: forever, while a freeze that really hurts shows as a larger rise.
DEFAULT_TOLERANCE = 0.01


def next_streaks(
    streaks: Sequence[int], prev: Sequence[float], cur: Sequence[float], threshold: float
) -> tuple[int, ...]:
    """Update the per-layer counts of consecutive quiet observations with one new interval.

    Args:
        streaks: per layer, consecutive observations so far whose change rate was below ``threshold``.
        prev: per-layer norms of the previous interval.
        cur: per-layer norms of this interval.
        threshold: a change rate strictly below it is quiet.

    Returns:
        ``streak + 1`` for layers whose change rate ``|prev - cur| / prev`` is below ``threshold``, else 0.
    """
    if not len(streaks) == len(prev) == len(cur):
        raise FreezeError(
            f"next_streaks: {len(streaks)} streaks, {len(prev)} previous and {len(cur)} current norms; "
            "expected one of each per layer"
        )
    ratios = change_ratios(tuple(prev), tuple(cur))
    return tuple(s + 1 if r < threshold else 0 for s, r in zip(streaks, ratios, strict=True))


class Converged(StreakPolicy):
    """Statistics-driven policy: freeze the next leading layer once its gradient norm has stopped changing.

    Args:
        num_layers: freezable layers L (the options after it are keyword-only).
        threshold: a change rate of the mean-gradient L2 norm strictly below it is a quiet interval (> 0).
        patience: consecutive quiet intervals a layer needs to count as converged (>= 1).
        max_fraction: the policy never freezes more than ``floor(max_fraction * L)`` layers, in (0, 1].
        max_step: at most this many new layers per decision (>= 1).
        tolerance: the guard holds while the held-out loss exceeds ``best * (1 + tolerance)`` (for a positive
            best; ``best + tolerance * |best|`` in general), >= 0; None turns the guard off.

    Raises:
        FreezeError: an option outside its range.
    """

    name: ClassVar[str] = "converged"
    needs_stats: ClassVar[bool] = True
    owner: ClassVar[str] = "Converged"
    #: Its snapshots never had a ``plateau`` key (nor its ``repr``): old checkpoints load unchanged.
    has_plateau: ClassVar[bool] = False

    def __init__(
        self,
        num_layers: int,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        patience: int = DEFAULT_PATIENCE,
        max_fraction: float = DEFAULT_MAX_FRACTION,
        max_step: int = DEFAULT_MAX_STEP,
        tolerance: float | None = DEFAULT_TOLERANCE,
    ) -> None:
        check_num_layers("Converged", num_layers)
        CHECK.number("Converged: threshold", threshold)
        if not (math.isfinite(threshold) and threshold > 0.0):
            raise FreezeError(f"Converged: threshold must be a finite number > 0, got {threshold!r}")
        self.threshold = float(threshold)
        super().__init__(
            num_layers, patience=patience, max_fraction=max_fraction, max_step=max_step, tolerance=tolerance
        )
        self._prev: tuple[float, ...] | None = None  # norms of the previous interval

    def observe(self, stats: LayerStats) -> None:
        """Compare one interval's mean-gradient L2 norms with the previous interval's and update the streaks.

        Raises:
            FreezeError: statistics for a different number of layers, or over zero steps.
        """
        check_stats("Converged", self.num_layers, stats)
        cur = stats.mean_l2()
        if self._prev is not None:
            self._streaks = next_streaks(self._streaks, self._prev, cur, self.threshold)
        self._prev = cur
        self._fresh = True

    def observe_eval(self, loss: float) -> None:
        """Update the held-out guard with the loss measured after an interval.

        A loss that is not finite (a diverged evaluation) holds the guard and leaves the best loss as it was.
        """
        self.guard.observe(loss)

    def _signal_config(self) -> dict[str, Any]:
        return {"threshold": self.threshold}

    def _signal_state(self) -> dict[str, Any]:
        # Every value is finite or None (statistics are finite), so the snapshot stays plain JSON.
        return {"prev": norms_to_state(self._prev)}

    def _load_signal(self, state: dict[str, Any]) -> tuple[int, ...]:
        streaks = tuple(int(s) for s in state["streaks"])
        if len(streaks) != self.num_layers:
            raise FreezeError(
                f"Converged.load_state_dict: {len(streaks)} streaks in the snapshot, expected {self.num_layers}"
            )
        self._prev = norms_from_state(state["prev"])
        return streaks
