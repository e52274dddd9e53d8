"""Freeze a leading layer once its output on a fixed probe batch has stopped changing (registry name ``"drift"``).

Gradient norms fall as the loss falls, whether or not a layer still has to change (docs/freeze.md, "The
accuracy/compute frontier"); the drift of a layer's *output* between decision points measures the change itself.
With Adam the size of an update barely depends on the gradient's size, so what makes an output drift over an
interval is updates that keep pointing the same way; once a layer's gradient is mostly noise its updates cancel
and its output stops moving. In fine-tuning from a pre-trained checkpoint the lower blocks often barely move at
all, and this signal sees it from the first interval::

    c_l(t)    = ||H_l(t) - H_l(t-1)||_F / ||H_l(t-1)||_F     H_l: layer l's output on the probe batch, eval mode
    still_l   = c_l(t) <= threshold
                or c_l(t) <= relative * c_top(t)        (relative; top = cap - 1, the highest watched layer)
                or c_top(t) <= settle * max_s c_top(s)  (settle: the whole network has slowed down)
    streak_l  = consecutive observations with still_l                       (reset to 0 by any other one)
    ready     = leading active layers current, current+1, ... with streak >= patience, stopping at the first other
    proposal  = current + min(ready, max_step, cap - current)               cap = floor(max_fraction * L)

(Egeria, Wang et al. 2023, compares a layer with a slowly updated reference copy for the same purpose.)
``H_l`` depends on every layer up to ``l``, so ``c_l`` is the drift of the prefix ``0..l`` that freezing would fix.

The two optional tests read the drift against the network's own: ``relative`` calls a layer still while it moves
much less than the highest watched one (a pre-trained encoder's lower blocks, from the first interval on, whatever
the learning rate), ``settle`` calls every layer still once the highest one's drift has fallen to a small share of
the largest it has shown (late in a decaying schedule, when freezing everything left costs little). Both came
from the two study tasks' probe drifts (docs/freeze.md, "The drift policy on the two tasks").

The runtime computes the numbers (:class:`~elastic_pipe.freeze.probe.OutputDrift` and
:func:`~elastic_pipe.freeze.probe.relative_change`, merged over stages) and hands them to :meth:`Drift.observe_drift`
at each decision point; the policy is pure. It reads no gradient statistics (``needs_stats`` is False, so steps
accumulate nothing) and says ``needs_probe = True``. Only a contiguous prefix freezes, one decision per
observation, and the held-out guard (:class:`~elastic_pipe.freeze.guard.HeldOutGuard`) stops freezing while the
held-out loss is worse than the best seen (or, with ``plateau``, still improving).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from elastic_pipe.freeze.errors import FreezeError
from elastic_pipe.freeze.policy import check_num_layers
from elastic_pipe.freeze.stats import LayerStats
from elastic_pipe.freeze.streaks import StreakPolicy

__all__ = [
    "DEFAULT_MAX_FRACTION",
    "DEFAULT_MAX_STEP",
    "DEFAULT_PATIENCE",
    "DEFAULT_THRESHOLD",
    "DEFAULT_TOLERANCE",
    "Drift",
    "quiet_streaks",
]

#: An output that moved by at most 1% (relative, Frobenius) over an interval counts as still. A block of a
#: pre-trained encoder that fine-tuning barely touches moves by a fraction of that.
DEFAULT_THRESHOLD = 0.01

#: Still intervals in a row before a layer counts as settled: two rule out one quiet reading between busy ones.
DEFAULT_PATIENCE = 2

#: The most layers ever frozen, as a share of L: the layers next to the head adapt most in fine-tuning.
DEFAULT_MAX_FRACTION = 0.85

#: One layer per decision, so that the next held-out loss shows each freeze's effect before another layer goes.
DEFAULT_MAX_STEP = 1

#: The guard holds once the held-out loss is more than 1% (relative) above the best seen.
DEFAULT_TOLERANCE = 0.01


def quiet_streaks(streaks: Sequence[int], change: Sequence[float], threshold: float) -> tuple[int, ...]:
    """Update the per-layer counts of consecutive still observations with one interval's output changes.

    Args:
        streaks: per layer, consecutive observations so far with a change at most ``threshold``.
        change: per layer, this interval's relative output change (``inf``: nothing to compare with).
        threshold: a change at most this is still.

    Returns:
        ``streak + 1`` where ``change <= threshold``, else 0.

    Raises:
        FreezeError: the lengths differ, or a change is negative or not a number.
    """
    if len(streaks) != len(change):
        raise FreezeError(f"quiet_streaks: {len(streaks)} streaks but {len(change)} changes; expected one per layer")
    for i, c in enumerate(change):
        if math.isnan(c) or c < 0:
            raise FreezeError(f"quiet_streaks: change[{i}] must be a number >= 0 (or inf), got {c!r}")
    return tuple(s + 1 if c <= threshold else 0 for s, c in zip(streaks, change, strict=True))


class Drift(StreakPolicy):
    """Probe-driven policy: freeze the next leading layer once its output has stayed still for ``patience``
    decision intervals.

    Args:
        num_layers: freezable layers L (the options after it are keyword-only).
        threshold: an interval is still when the layer's relative output change is at most this, finite, >= 0.
        relative: an interval is also still when the layer's change is at most this share of the highest watched
            layer's change in the same interval, in (0, 1); None: no relative test.
        settle: every layer's interval is also still once the highest watched layer's change is at most this
            share of the largest it has shown, in (0, 1); None: no such test. With ``max_step`` of L and
            ``max_fraction`` 1.0, everything below the head freezes at once when the network settles.
        patience: consecutive still intervals a layer needs (>= 1).
        max_fraction: never freeze more than ``floor(max_fraction * L)`` layers, in (0, 1].
        max_step: at most this many new layers per decision (>= 1).
        tolerance: the held-out guard holds while the loss exceeds ``best + tolerance * |best|`` (>= 0); None turns
            it off.
        plateau: the guard also holds while the held-out loss still improves by more than this share of the best
            (and until the first loss arrives). None: no wait.

    Raises:
        FreezeError: an option outside its range.
    """

    name: ClassVar[str] = "drift"
    needs_stats: ClassVar[bool] = False
    #: The runtime runs the probe batch at each decision point and calls :meth:`observe_drift`.
    needs_probe: ClassVar[bool] = True
    owner: ClassVar[str] = "Drift"

    def __init__(
        self,
        num_layers: int,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        relative: float | None = None,
        settle: float | None = None,
        patience: int = DEFAULT_PATIENCE,
        max_fraction: float = DEFAULT_MAX_FRACTION,
        max_step: int = DEFAULT_MAX_STEP,
        tolerance: float | None = DEFAULT_TOLERANCE,
        plateau: float | None = None,
    ) -> None:
        check_num_layers("Drift", num_layers)
        if isinstance(threshold, bool) or not (math.isfinite(threshold) and threshold >= 0.0):
            raise FreezeError(f"Drift: threshold must be a finite number >= 0, got {threshold!r}")
        for option, value in (("relative", relative), ("settle", settle)):
            if value is not None and (isinstance(value, bool) or not 0.0 < value < 1.0):
                raise FreezeError(f"Drift: {option} must be a number in (0, 1) or None, got {value!r}")
        self.threshold = float(threshold)
        self.relative = None if relative is None else float(relative)
        self.settle = None if settle is None else float(settle)
        self._top_peak = 0.0  # the largest finite drift of the highest watched layer so far (settle)
        super().__init__(
            num_layers,
            patience=patience,
            max_fraction=max_fraction,
            max_step=max_step,
            tolerance=tolerance,
            plateau=plateau,
        )

    def observe(self, stats: LayerStats) -> None:
        """Ignored: the policy reads the probe's output drift, not gradient statistics."""

    def observe_drift(self, change: Sequence[float]) -> None:
        """Take in one interval's relative output change per layer (:func:`~elastic_pipe.freeze.probe.
        relative_change`); layers frozen or past the cap may read anything.

        Raises:
            FreezeError: not one value per layer, or a value that is negative or not a number.
        """
        if len(change) != self.num_layers:
            raise FreezeError(f"Drift.observe_drift: got {len(change)} changes, expected {self.num_layers}")
        values = [float(c) for c in change]
        streaks = quiet_streaks(self._streaks, values, self.threshold)  # also checks the values
        top = self.signal_layers - 1  # the highest watched layer (-1: a cap of 0, nothing ever freezes)
        c_top = values[top] if top >= 0 else math.inf
        if math.isfinite(c_top):  # inf: the top layer has no baseline yet, so nothing is relative to it
            if self.settle is not None:
                self._top_peak = max(self._top_peak, c_top)
                if c_top <= self.settle * self._top_peak:
                    streaks = tuple(s + 1 for s in self._streaks)  # the whole network is still this interval
            if self.relative is not None and c_top > 0.0:
                bound = self.relative * c_top
                streaks = tuple(
                    new if new > 0 or layer >= top or values[layer] > bound else old + 1
                    for layer, (new, old) in enumerate(zip(streaks, self._streaks, strict=True))
                )
        self._streaks = streaks
        self._fresh = True

    def observe_eval(self, loss: float) -> None:
        """Update the held-out guard with a held-out loss."""
        self.guard.observe(loss)

    def _signal_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"threshold": self.threshold}
        # only when set, so that the snapshots of runs without them still load
        config.update({k: v for k, v in (("relative", self.relative), ("settle", self.settle)) if v is not None})
        return config

    def _signal_state(self) -> dict[str, Any]:
        return {} if self.settle is None else {"top_peak": self._top_peak}

    def _load_signal(self, state: dict[str, Any]) -> tuple[int, ...]:
        streaks = tuple(int(s) for s in state["streaks"])
        if len(streaks) != self.num_layers or any(s < 0 for s in streaks):
            raise FreezeError(
                f"Drift.load_state_dict: streaks {list(streaks)} in the snapshot, expected {self.num_layers} "
                "counts >= 0"
            )
        if self.settle is not None:
            peak = state.get("top_peak")
            if isinstance(peak, bool) or not isinstance(peak, int | float) or not (math.isfinite(peak) and peak >= 0):
                raise FreezeError(f"Drift.load_state_dict: top_peak {peak!r} in the snapshot, expected a number >= 0")
            self._top_peak = float(peak)
        return streaks
