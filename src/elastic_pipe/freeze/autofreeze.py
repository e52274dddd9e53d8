"""AutoFreeze's gradient-norm-change rule (Liu et al., "AutoFreeze: Automatically Freezing Model Blocks to
Accelerate Fine-tuning", 2021), as PipeTransformer applies it to a frozen prefix.

At each decision point, with ``prev_l`` and ``cur_l`` the L1 norms of layer ``l``'s gradient accumulated over the
previous and the current interval (normalized by the interval's step count, so intervals of different lengths
compare)::

    r_l = |prev_l - cur_l| / prev_l          for every active layer l
    t   = percentile(r over active layers, q)        (q = 50: the median)
    freeze up to and including the first active layer with r_l >= t

A layer whose previous norm is 0 has ``r = 0`` if its current norm is 0 too, else ``r = inf``. The first interval
only sets the baseline. Decision points are defined by the caller: every :meth:`AutoFreeze.observe` followed by a
:meth:`AutoFreeze.propose` is one. The statistics must come from a real accumulation over the interval
(:class:`~elastic_pipe.freeze.GradNormTracker` does that); the public PipeTransformer copy read one step's gradient.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from elastic_pipe.freeze._numeric import percentile
from elastic_pipe.freeze._observed import check_stats, norms_from_state, norms_to_state
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_config, check_current, check_num_layers
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["AutoFreeze", "change_ratios"]


def change_ratios(prev: tuple[float, ...], cur: tuple[float, ...]) -> tuple[float, ...]:
    """Per-layer relative change ``|prev - cur| / prev`` (0 for 0 -> 0, ``inf`` for 0 -> nonzero)."""
    prev = tuple(CHECK.floats("change_ratios: prev", prev, empty=True))
    cur = tuple(CHECK.floats("change_ratios: cur", cur, empty=True))
    if len(prev) != len(cur):
        raise FreezeError(f"change_ratios: {len(prev)} previous norms but {len(cur)} current ones")
    out = []
    for p, c in zip(prev, cur, strict=True):
        if p > 0:
            out.append(abs(p - c) / p)
        else:
            out.append(0.0 if c == 0 else math.inf)
    return tuple(out)


class AutoFreeze:
    """Statistics-driven policy: freeze through the first active layer whose gradient-norm change reaches the
    ``percentile``-th percentile of the active layers' changes.

    Args:
        num_layers: freezable layers L.
        percentile: percentile q in [0, 100] of the change ratios used as the threshold (50 = median).
    """

    name: ClassVar[str] = "autofreeze"
    needs_stats: ClassVar[bool] = True

    def __init__(self, num_layers: int, percentile: float = 50.0) -> None:
        check_num_layers("AutoFreeze", num_layers)
        CHECK.number("AutoFreeze: percentile", percentile)
        if not (math.isfinite(percentile) and 0.0 <= percentile <= 100.0):
            raise FreezeError(f"AutoFreeze: percentile must be in [0, 100], got {percentile!r}")
        self.num_layers = num_layers
        self.percentile = float(percentile)
        self._prev: tuple[float, ...] | None = None
        self._pending: tuple[float, ...] | None = None
        self._frozen = 0

    def __repr__(self) -> str:
        return f"AutoFreeze(num_layers={self.num_layers}, percentile={self.percentile})"

    def observe(self, stats: LayerStats) -> None:
        """Record one interval's accumulated L1 norms (a second observation before a decision replaces the first).

        Raises:
            FreezeError: statistics for a different number of layers, or over zero steps.
        """
        check_stats("AutoFreeze", self.num_layers, stats)
        self._pending = stats.mean_l1()

    def observe_eval(self, loss: float) -> None:
        """Ignored: the rule reads gradient statistics only."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """Decide if an interval was observed since the last decision; else repeat the last answer."""
        check_current("AutoFreeze", self.num_layers, current)
        self._frozen = max(self._frozen, current)
        if self._pending is None:
            return self._frozen
        cur, self._pending = self._pending, None
        prev, self._prev = self._prev, cur
        if prev is None or self._frozen >= self.num_layers:
            return self._frozen
        start = self._frozen
        ratios = change_ratios(prev[start:], cur[start:])
        threshold = percentile(ratios, self.percentile)
        first = next(i for i, r in enumerate(ratios) if r >= threshold)
        self._frozen = start + first + 1
        return self._frozen

    def state_dict(self) -> dict[str, Any]:
        """Configuration plus the baseline norms, pending norms and the last decision.

        Infinite values cannot occur (statistics are finite), so the snapshot is plain JSON.
        """
        return {
            "policy": self.name,
            "num_layers": self.num_layers,
            "percentile": self.percentile,
            "prev": norms_to_state(self._prev),
            "pending": norms_to_state(self._pending),
            "frozen": self._frozen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot of an :class:`AutoFreeze` with the same ``num_layers`` and ``percentile``."""
        check_config(
            "AutoFreeze", state, {"policy": self.name, "num_layers": self.num_layers, "percentile": self.percentile}
        )
        self._prev = norms_from_state(state["prev"])
        self._pending = norms_from_state(state["pending"])
        self._frozen = int(state["frozen"])
