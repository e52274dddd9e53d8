"""The published per-epoch progressive schedule: ``frozen(e) = ceil(L * (1 - (1 - alpha) ** e))``.

This is the closed form of PipeTransformer's progressive term ``F(T) = F(T-1) + alpha * (L - F(T-1))`` with
``F(0) = 0``, as the public PipeTransformer code applies it once per epoch (He et al., ICML 2021). For L = 12:
alpha = 1/3 gives 0, 4, 7, 9, 10, 11, 11, 12, ... and alpha = 1/2 gives 0, 6, 9, 11, 12. The ceiling is taken
with a small float tolerance (see ``_numeric``), since ``12 * (1 - (2/3) ** 1)`` evaluates to 4.000000000000001.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from elastic_pipe.freeze._numeric import ceil_tolerant
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_config, check_current, check_num_layers
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["AlphaSchedule", "alpha_frozen", "check_alpha"]


def check_alpha(owner: str, alpha: float) -> None:
    """Raise :class:`FreezeError` unless ``0 < alpha <= 1``."""
    CHECK.number(f"{owner}: alpha", alpha)
    if not (math.isfinite(alpha) and 0.0 < alpha <= 1.0):
        raise FreezeError(f"{owner}: alpha must be in (0, 1], got {alpha!r}")


def alpha_frozen(num_layers: int, alpha: float, epoch: int) -> int:
    """Frozen count of the published schedule at the start of ``epoch``.

    Args:
        num_layers: freezable layers L >= 1.
        alpha: fraction of the still-active layers frozen per epoch, in (0, 1].
        epoch: 0-based epoch (0 freezes nothing).

    Returns:
        ``ceil(L * (1 - (1 - alpha) ** epoch))``, robust to float noise, in ``[0, L]``.
    """
    check_num_layers("alpha_frozen", num_layers)
    check_alpha("alpha_frozen", alpha)
    CHECK.int("alpha_frozen: epoch", epoch)
    return min(num_layers, ceil_tolerant(num_layers * (1.0 - (1.0 - alpha) ** epoch)))


class AlphaSchedule:
    """Schedule-driven policy: the published progressive term only, evaluated per epoch (ignores statistics).

    Args:
        num_layers: freezable layers L.
        alpha: fraction of the still-active layers frozen per epoch, in (0, 1].
    """

    name: ClassVar[str] = "alpha"
    needs_stats: ClassVar[bool] = False

    def __init__(self, num_layers: int, alpha: float) -> None:
        check_num_layers("AlphaSchedule", num_layers)
        check_alpha("AlphaSchedule", alpha)
        self.num_layers = num_layers
        self.alpha = float(alpha)

    def __repr__(self) -> str:
        return f"AlphaSchedule(num_layers={self.num_layers}, alpha={self.alpha})"

    def observe(self, stats: LayerStats) -> None:
        """Ignored: the schedule depends on the epoch only."""

    def observe_eval(self, loss: float) -> None:
        """Ignored: the schedule depends on the epoch only."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """``max(current, alpha_frozen(L, alpha, epoch))``."""
        check_current("AlphaSchedule", self.num_layers, current)
        return max(current, alpha_frozen(self.num_layers, self.alpha, epoch))

    def _config(self) -> dict[str, Any]:
        return {"policy": self.name, "num_layers": self.num_layers, "alpha": self.alpha}

    def state_dict(self) -> dict[str, Any]:
        """Configuration only: the schedule has no mutable state."""
        return self._config()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check that the snapshot belongs to the same schedule."""
        check_config("AlphaSchedule", state, self._config())
