"""The PipeTransformer paper's freeze rule: a progressive term capped by the gradient-norm argmin.

He, Li, Soltanolkotabi, Avestimehr, "PipeTransformer" (ICML 2021)::

    L_frozen(T) = min( L_frozen(T-1) + alpha * (L - L_frozen(T-1)),  argmin_{l active} ||g_l(T)|| )

One decision step T per epoch. Here the progressive term is kept as a real number ``p`` (so that without the cap
the rule reproduces :class:`~elastic_pipe.freeze.AlphaSchedule` exactly) and the frozen count is its tolerant
ceiling. The cap is the first active layer whose gradient norm (L2 of the interval's mean gradient) is smallest,
counted *through* that layer: with 0-based layer ``l`` as the argmin, at most ``l + 1`` layers are frozen. When no
statistics arrived since the previous decision, nothing new is frozen (the cap is the current count): the rule
never freezes blind.
"""

from __future__ import annotations

from typing import Any, ClassVar

from elastic_pipe.freeze._numeric import ceil_tolerant
from elastic_pipe.freeze._observed import check_stats, norms_from_state, norms_to_state
from elastic_pipe.freeze.alpha import check_alpha
from elastic_pipe.freeze.policy import check_config, check_current, check_num_layers
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["PaperRule"]


class PaperRule:
    """Statistics-driven policy: ``min(progressive alpha term, gradient-norm argmin over active layers)``.

    Args:
        num_layers: freezable layers L.
        alpha: fraction of the still-active layers the progressive term adds per epoch, in (0, 1].
    """

    name: ClassVar[str] = "paper"
    needs_stats: ClassVar[bool] = True

    def __init__(self, num_layers: int, alpha: float) -> None:
        check_num_layers("PaperRule", num_layers)
        check_alpha("PaperRule", alpha)
        self.num_layers = num_layers
        self.alpha = float(alpha)
        self._progress = 0.0  # the real-valued progressive term p
        self._epoch = 0  # epoch of the last decision
        self._latest: tuple[float, ...] | None = None  # mean-gradient L2 norms observed since that decision

    def __repr__(self) -> str:
        return f"PaperRule(num_layers={self.num_layers}, alpha={self.alpha})"

    def observe(self, stats: LayerStats) -> None:
        """Keep the latest per-layer gradient norms (a later observation replaces an earlier one).

        Raises:
            FreezeError: statistics for a different number of layers, or over zero steps.
        """
        check_stats("PaperRule", self.num_layers, stats)
        self._latest = stats.mean_l2()

    def observe_eval(self, loss: float) -> None:
        """Ignored: the rule reads gradient statistics only."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """Take one decision step per epoch elapsed since the last decision; else repeat the last answer."""
        check_current("PaperRule", self.num_layers, current)
        frozen = ceil_tolerant(self._progress)
        if current > frozen:
            # someone froze more than the rule did (a manual override, a restart): continue from there
            self._progress, frozen = float(current), current
        if epoch <= self._epoch:
            return max(current, frozen)
        p = self._progress
        for _ in range(epoch - self._epoch):
            p += self.alpha * (self.num_layers - p)
        cap = self._cap(current)
        self._progress = min(p, float(cap))
        self._epoch = epoch
        self._latest = None
        return max(current, min(self.num_layers, ceil_tolerant(self._progress)))

    def _cap(self, current: int) -> int:
        if self._latest is None or current >= self.num_layers:
            return current
        active = self._latest[current:]
        argmin = current + active.index(min(active))  # first of equal minima
        return argmin + 1

    def state_dict(self) -> dict[str, Any]:
        """Configuration plus the progressive term, the last decision's epoch and pending statistics."""
        return {
            "policy": self.name,
            "num_layers": self.num_layers,
            "alpha": self.alpha,
            "progress": self._progress,
            "epoch": self._epoch,
            "latest": norms_to_state(self._latest),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot of a :class:`PaperRule` with the same ``num_layers`` and ``alpha``."""
        check_config("PaperRule", state, {"policy": self.name, "num_layers": self.num_layers, "alpha": self.alpha})
        latest = state["latest"]
        self._progress = float(state["progress"])
        self._epoch = int(state["epoch"])
        self._latest = norms_from_state(latest)
