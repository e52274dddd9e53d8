"""Freeze a leading layer once its gradient has settled well below its peak (registry name ``"settled"``).

Fine-tuning a pre-trained model, a layer's gradient grows while the new head starts to use it, peaks, and then
falls as the loss the layer can still reduce runs out; once it has stayed far below its peak, further updates of
that layer buy little. The signal is scale-free, so one threshold fits every layer and model::

    n_l(t)    = L2 norm of layer l's mean gradient over interval t           (LayerStats.mean_l2)
    peak_l(t) = max(n_l(1), ..., n_l(t))
    streak_l  = consecutive observations with n_l(t) <= decay * peak_l(t)    (reset to 0 by any other one)
    ready     = leading active layers current, current+1, ... with streak >= patience, stopping at the first other
    proposal  = current + min(ready, max_step, cap - current)                cap = floor(max_fraction * L)

Compared with :class:`~elastic_pipe.freeze.Converged` (relative change between intervals), the decay from the
peak does not confuse the sampling noise of a short interval's mean gradient with movement: noise keeps the
change rate high forever, while it only adds a floor under ``n_l`` that sits below a real peak. Only a contiguous
prefix freezes, one decision per observation, and the held-out guard (:class:`~elastic_pipe.freeze.guard.
HeldOutGuard`) stops freezing while the held-out loss is worse than the best seen.

The statistics are the per-layer gradient norms the orchestrator already gathers for AutoFreeze and Converged
(:class:`~elastic_pipe.freeze.GradNormTracker`, merged over stages), so the signal costs no extra communication.

Measured (benchmarks/bench_freeze_accuracy.py, docs/freeze.md "The accuracy/compute frontier"): the signal is not a
safe default. On MiniLM/BBC News its defaults barely freeze (2% of the compute saved, accuracy kept); on a ViT
fine-tuned from MNIST-5k to digits the gradients decay early while the lower blocks still need to adapt, and it
loses 12 points. Use it with the ``plateau`` guard, or prefer a late schedule, where accuracy matters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from elastic_pipe.freeze._observed import check_stats, norms_from_state, norms_to_state
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_num_layers
from elastic_pipe.freeze.stats import LayerStats
from elastic_pipe.freeze.streaks import StreakPolicy

__all__ = [
    "DEFAULT_DECAY",
    "DEFAULT_MAX_FRACTION",
    "DEFAULT_MAX_STEP",
    "DEFAULT_PATIENCE",
    "DEFAULT_TOLERANCE",
    "Settled",
    "settled_streaks",
]

#: A layer whose mean-gradient norm is at most half its peak has settled for that interval: the loss it can still
#: reduce is a fraction of what it was. Half, rather than a tenth, because the sampling noise of an interval's mean
#: gradient keeps the norm above a floor that can sit at a sizeable share of the peak.
DEFAULT_DECAY = 0.5

#: Settled intervals in a row before a layer counts as converged: two rule out one low reading between two high
#: ones (a noisy interval) while letting a run of a few epochs freeze early enough to save compute.
DEFAULT_PATIENCE = 2

#: The most layers ever frozen, as a share of L: the last layer (or more for L >= 7) always trains, since the layers
#: next to the head adapt most in fine-tuning.
DEFAULT_MAX_FRACTION = 0.85

#: One layer per decision, so that the next held-out loss shows each freeze's effect before another layer goes.
DEFAULT_MAX_STEP = 1

#: The guard holds once the held-out loss is more than 1% (relative) above the best seen.
DEFAULT_TOLERANCE = 0.01


def settled_streaks(
    streaks: Sequence[int], peaks: Sequence[float], cur: Sequence[float], decay: float
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Update the per-layer peaks and counts of consecutive settled observations with one new interval.

    Args:
        streaks: per layer, consecutive settled observations so far.
        peaks: per layer, the largest norm seen before this interval (0 for none yet).
        cur: per-layer norms of this interval.
        decay: an interval is settled when its norm is at most ``decay`` times the peak (this one included).

    Returns:
        ``(streaks, peaks)`` after the interval: ``streak + 1`` where ``cur <= decay * peak``, else 0.
        A layer whose norm has always been 0 has no gradient to wait for and counts as settled.
    """
    if not len(streaks) == len(peaks) == len(cur):
        raise FreezeError(
            f"settled_streaks: {len(streaks)} streaks, {len(peaks)} peaks and {len(cur)} norms; "
            "expected one of each per layer"
        )
    new_peaks = tuple(max(p, c) for p, c in zip(peaks, cur, strict=True))
    new_streaks = tuple(s + 1 if c <= decay * p else 0 for s, p, c in zip(streaks, new_peaks, cur, strict=True))
    return new_streaks, new_peaks


class Settled(StreakPolicy):
    """Statistics-driven policy: freeze the next leading layer once its gradient stays well below its peak.

    Args:
        num_layers: freezable layers L (the options after it are keyword-only).
        decay: an interval is settled when the layer's mean-gradient L2 norm is at most ``decay`` times its peak
            so far, in (0, 1).
        patience: consecutive settled intervals a layer needs (>= 1).
        max_fraction: never freeze more than ``floor(max_fraction * L)`` layers, in (0, 1].
        max_step: at most this many new layers per decision (>= 1).
        tolerance: the held-out guard holds while the loss exceeds ``best + tolerance * |best|`` (>= 0); None turns
            it off.
        plateau: the guard also holds while the held-out loss still improves by more than this share of the best
            (and until the first loss arrives): freezing waits for the held-out loss to flatten. None: no wait.

    Raises:
        FreezeError: an option outside its range.
    """

    name: ClassVar[str] = "settled"
    needs_stats: ClassVar[bool] = True
    owner: ClassVar[str] = "Settled"

    def __init__(
        self,
        num_layers: int,
        *,
        decay: float = DEFAULT_DECAY,
        patience: int = DEFAULT_PATIENCE,
        max_fraction: float = DEFAULT_MAX_FRACTION,
        max_step: int = DEFAULT_MAX_STEP,
        tolerance: float | None = DEFAULT_TOLERANCE,
        plateau: float | None = None,
    ) -> None:
        check_num_layers("Settled", num_layers)
        if not (math.isfinite(CHECK.number("Settled: decay", decay)) and 0.0 < decay < 1.0):
            raise FreezeError(f"Settled: decay must be in (0, 1), got {decay!r}")
        self.decay = float(decay)
        super().__init__(
            num_layers,
            patience=patience,
            max_fraction=max_fraction,
            max_step=max_step,
            tolerance=tolerance,
            plateau=plateau,
        )
        self._peaks: tuple[float, ...] | None = None

    def observe(self, stats: LayerStats) -> None:
        """Update each layer's peak and settled streak with one interval's mean-gradient L2 norms.

        Raises:
            FreezeError: statistics for a different number of layers, or over zero steps.
        """
        check_stats("Settled", self.num_layers, stats)
        peaks = self._peaks if self._peaks is not None else (0.0,) * self.num_layers
        self._streaks, self._peaks = settled_streaks(self._streaks, peaks, stats.mean_l2(), self.decay)
        self._fresh = True

    def observe_eval(self, loss: float) -> None:
        """Update the held-out guard with a held-out loss."""
        self.guard.observe(loss)

    def _signal_config(self) -> dict[str, Any]:
        return {"decay": self.decay}

    def _signal_state(self) -> dict[str, Any]:
        return {"peaks": norms_to_state(self._peaks)}

    def _load_signal(self, state: dict[str, Any]) -> tuple[int, ...]:
        streaks = tuple(int(s) for s in state["streaks"])
        peaks = norms_from_state(state["peaks"])
        if len(streaks) != self.num_layers or (peaks is not None and len(peaks) != self.num_layers):
            raise FreezeError(
                f"Settled.load_state_dict: {len(streaks)} streaks and "
                f"{None if peaks is None else len(peaks)} peaks in the snapshot, expected {self.num_layers} of each"
            )
        self._peaks = peaks
        return streaks
