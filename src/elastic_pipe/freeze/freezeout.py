"""FreezeOut's time schedule (Brock, Lim, Ritchie, Weston: "FreezeOut: Accelerate Training by Progressively
Freezing Layers", 2017).

Layer ``i`` (0-based, of L) stops training at the fraction ``t_i = t0 + (1 - t0) * i / L`` of the run, or at
``t_i ** 3`` with the cubic variant (which freezes the early layers sooner); until then its learning rate is
annealed from its base value to 0 with a half cosine, ``0.5 * (1 + cos(pi * t / t_i))``. The frozen set is always
a prefix because ``t_i`` increases with ``i``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from elastic_pipe.freeze._numeric import reached
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_config, check_current, check_num_layers
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["FreezeOut"]


class FreezeOut:
    """Schedule-driven policy: layer ``i`` freezes once ``step >= t_i * total_steps``.

    Args:
        num_layers: freezable layers L.
        t0: fraction of the run after which layer 0 stops, in (0, 1].
        total_steps: optimizer steps of the whole run, >= 1.
        cubic: use ``t_i ** 3`` instead of ``t_i``.
    """

    name: ClassVar[str] = "freezeout"
    needs_stats: ClassVar[bool] = False

    def __init__(self, num_layers: int, t0: float, total_steps: int, cubic: bool = False) -> None:
        check_num_layers("FreezeOut", num_layers)
        if not (math.isfinite(CHECK.number("FreezeOut: t0", t0)) and 0.0 < t0 <= 1.0):
            raise FreezeError(f"FreezeOut: t0 must be in (0, 1], got {t0!r}")
        CHECK.int("FreezeOut: total_steps", total_steps, lo=1)
        self.num_layers = num_layers
        self.t0 = float(t0)
        self.total_steps = total_steps
        self.cubic = bool(cubic)

    def __repr__(self) -> str:
        return (
            f"FreezeOut(num_layers={self.num_layers}, t0={self.t0}, total_steps={self.total_steps}, cubic={self.cubic})"
        )

    def stop_fraction(self, layer: int) -> float:
        """``t_i``: the fraction of the run at which ``layer`` stops training."""
        if not 0 <= layer < self.num_layers:
            raise FreezeError(f"FreezeOut.stop_fraction: layer must be in [0, {self.num_layers}), got {layer}")
        t = self.t0 + (1.0 - self.t0) * layer / self.num_layers
        return t**3 if self.cubic else t

    def stop_step(self, layer: int) -> float:
        """The (fractional) step at which ``layer`` stops training."""
        return self.stop_fraction(layer) * self.total_steps

    def frozen_at(self, step: int) -> int:
        """Number of leading layers whose stop step has been reached at ``step``."""
        return sum(1 for i in range(self.num_layers) if reached(step, self.stop_step(i)))

    def lr_scale(self, layer: int, step: int) -> float:
        """Multiplier of ``layer``'s base learning rate at ``step``: a half cosine from 1 down to 0 at its stop."""
        stop = self.stop_step(layer)
        if reached(step, stop):
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * step / stop))

    def observe(self, stats: LayerStats) -> None:
        """Ignored: the schedule depends on the step only."""

    def observe_eval(self, loss: float) -> None:
        """Ignored: the schedule depends on the step only."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """``max(current, frozen_at(step))``."""
        check_current("FreezeOut", self.num_layers, current)
        return max(current, self.frozen_at(step))

    def _config(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "num_layers": self.num_layers,
            "t0": self.t0,
            "total_steps": self.total_steps,
            "cubic": self.cubic,
        }

    def state_dict(self) -> dict[str, Any]:
        """Configuration only: the schedule has no mutable state."""
        return self._config()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check that the snapshot belongs to the same schedule."""
        check_config("FreezeOut", state, self._config())
