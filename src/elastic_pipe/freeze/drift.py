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
                or c_top(t) <= settle * max_s c_top(s)  (settle: the whole network has slowed down;
                                                         with settle_after, only from that share of the run on)
    streak_l  = consecutive observations with still_l                       (reset to 0 by any other one)
    ready     = leading active layers current, current+1, ... with streak >= patience, stopping at the first other
    proposal  = current + min(ready, max_step, cap - current)               cap = floor(max_fraction * L)

(Egeria, Wang et al. 2023, compares a layer with a slowly updated reference copy for the same purpose.)
``H_l`` depends on every layer up to ``l``, so ``c_l`` is the drift of the prefix ``0..l`` that freezing would fix.

The two optional tests read the drift against the network's own: ``relative`` calls a layer still while it moves
much less than the highest watched one (a pre-trained encoder's lower blocks, from the first interval on, whatever
the learning rate), ``settle`` calls every layer still once the highest one's drift has fallen to a small share of
the largest it has shown (late in a decaying schedule, when freezing everything left costs little). Both came
from the two study tasks' probe drifts (docs/freeze.md, "The drift policy on the two tasks"). ``settle_after``
keeps the settle test out of the first part of the run (a share of ``total_steps``, which a runtime fills in with
the run's length, as for FreezeOut): a fine-tune whose top layers settle early may still need them. The defaults
are the setting the accuracy study chose, with the cap and the settle floor the time-to-accuracy runs moved
(docs/freeze.md, "The default policy").

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

from elastic_pipe.freeze._numeric import reached
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.policy import check_num_layers, check_positive_int
from elastic_pipe.freeze.stats import LayerStats
from elastic_pipe.freeze.streaks import StreakPolicy

__all__ = [
    "DECISIONS_PER_EPOCH",
    "DEFAULT_MAX_FRACTION",
    "DEFAULT_MAX_STEP",
    "DEFAULT_PATIENCE",
    "DEFAULT_RELATIVE",
    "DEFAULT_SETTLE",
    "DEFAULT_SETTLE_AFTER",
    "DEFAULT_THRESHOLD",
    "DEFAULT_TOLERANCE",
    "Drift",
    "quiet_streaks",
]

# The defaults are the setting the accuracy study measured within 0.5 points of no freezing on both of its tasks
# while skipping 51-52% of the forward+backward compute on one and 34% on the other (docs/freeze.md, "The default
# policy"), with decision points four times per epoch - all but the cap and the settle floor, which the
# time-to-accuracy benchmark moved: the cap from every layer to the lower two thirds, the floor from 60% of the run
# to 80% (docs/freeze.md, "The default policy", steps 4 to 6).

#: An output that moved by at most 1% (relative, Frobenius) over an interval counts as still. A block of a
#: pre-trained encoder that fine-tuning barely touches moves by a fraction of that.
DEFAULT_THRESHOLD = 0.01

#: A layer that moves by at most 15% as much as the highest watched layer in an interval counts as still: the lower
#: blocks of a pre-trained encoder from the first interval on; none of a network that still adapts as a whole.
DEFAULT_RELATIVE = 0.15

#: Every layer counts as still once the highest watched one moves by at most 30% of the most it has moved ...
DEFAULT_SETTLE = 0.3

#: ... but not before 80% of the run: the top layers of a fine-tune that settles early still pay for themselves. From
#: 60% (the accuracy study's setting) it ended 4.8 points lower on ViT-B/16 / digits at 224 px and 0.15 higher on
#: MiniLM-L6 / BBC News, three seeds each (docs/freeze.md, "The default policy", step 5).
DEFAULT_SETTLE_AFTER = 0.8

#: One still interval is enough: the relative test is stable from the first interval on.
DEFAULT_PATIENCE = 1

#: The lower two thirds at most (4 of 6 blocks, 8 of 12): the top third keeps training, and the relative test reads
#: its drift against the highest layer the cap lets freeze. All but the top layer (0.95) ended 0.67 points under no
#: freezing on MiniLM-L6 / BBC News in the time-to-accuracy benchmark, two thirds 0.23 points over it, three seeds
#: each in one job (docs/freeze.md, "The default policy", step 6); every layer (1.0, the accuracy study's setting)
#: ended 1.1 points lower than all but the top one on ViT-B/16 / digits at 224 px.
DEFAULT_MAX_FRACTION = 0.67

#: No limit on the layers frozen at one decision (None: all of them): a settled network freezes at once.
DEFAULT_MAX_STEP: int | None = None

#: No held-out guard: it stops freezing only when the held-out loss gets worse, which a block frozen too early does
#: not do (it makes the loss improve more slowly).
DEFAULT_TOLERANCE: float | None = None

#: Decision points per epoch the defaults were measured with; a runtime told no ``decide_every`` decides this often.
DECISIONS_PER_EPOCH = 4


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
            share of the largest it has shown, in (0, 1); None: no such test. With ``max_step`` of L, everything up to
            the cap freezes at once when the network settles (the default cap: the lower two thirds).
        settle_after: the settle test counts only at decision points from this share of ``total_steps`` on, in
            (0, 1]; None: from the start. Read only with ``settle``; then it needs ``total_steps``.
        total_steps: optimizer steps of the whole run (>= 1); read only with ``settle`` and ``settle_after`` (a
            runtime fills it in with the run's length).
        patience: consecutive still intervals a layer needs (>= 1).
        max_fraction: never freeze more than ``floor(max_fraction * L)`` layers, in (0, 1].
        max_step: at most this many new layers per decision (>= 1); None: no limit.
        tolerance: the held-out guard holds while the loss exceeds ``best + tolerance * |best|`` (>= 0); None turns
            it off.
        plateau: the guard also holds while the held-out loss still improves by more than this share of the best
            (and until the first loss arrives). None: no wait.

    Raises:
        FreezeError: an option outside its range.
    """

    name: ClassVar[str] = "drift"
    needs_stats: ClassVar[bool] = False
    #: How often a runtime told nothing else decides (:data:`DECISIONS_PER_EPOCH`).
    decisions_per_epoch: ClassVar[int] = DECISIONS_PER_EPOCH
    #: The runtime runs the probe batch at each decision point and calls :meth:`observe_drift`.
    needs_probe: ClassVar[bool] = True
    owner: ClassVar[str] = "Drift"

    def __init__(
        self,
        num_layers: int,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        relative: float | None = DEFAULT_RELATIVE,
        settle: float | None = DEFAULT_SETTLE,
        settle_after: float | None = DEFAULT_SETTLE_AFTER,
        total_steps: int | None = None,
        patience: int = DEFAULT_PATIENCE,
        max_fraction: float = DEFAULT_MAX_FRACTION,
        max_step: int | None = DEFAULT_MAX_STEP,
        tolerance: float | None = DEFAULT_TOLERANCE,
        plateau: float | None = None,
    ) -> None:
        check_num_layers("Drift", num_layers)
        if not (math.isfinite(CHECK.number("Drift: threshold", threshold)) and threshold >= 0.0):
            raise FreezeError(f"Drift: threshold must be a finite number >= 0, got {threshold!r}")
        for option, value in (("relative", relative), ("settle", settle)):
            if value is not None and not 0.0 < CHECK.number(f"Drift: {option}", value) < 1.0:
                raise FreezeError(f"Drift: {option} must be a number in (0, 1) or None, got {value!r}")
        if settle_after is not None and not (
            math.isfinite(CHECK.number("Drift: settle_after", settle_after)) and 0.0 < settle_after <= 1.0
        ):
            raise FreezeError(f"Drift: settle_after must be a number in (0, 1] or None, got {settle_after!r}")
        if total_steps is not None:
            check_positive_int("Drift", "total_steps", total_steps)
        elif settle is not None and settle_after is not None:
            raise FreezeError(
                f"Drift: settle_after = {settle_after} needs total_steps (the run's optimizer steps; a runtime fills "
                "it in); give total_steps, or settle_after=None"
            )
        self.threshold = float(threshold)
        self.relative = None if relative is None else float(relative)
        self.settle = None if settle is None else float(settle)
        # without settle there is nothing to delay
        self.settle_after = None if settle is None or settle_after is None else float(settle_after)
        self.total_steps = total_steps
        self._top_peak = 0.0  # the largest finite drift of the highest watched layer so far (settle)
        # with settle_after: the streaks without the settle test, which decide before settle_after of the run
        self._unsettled: tuple[int, ...] = (0,) * num_layers
        super().__init__(
            num_layers,
            patience=patience,
            max_fraction=max_fraction,
            max_step=num_layers if max_step is None else max_step,
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
        quiet_streaks(self._streaks, values, self.threshold)  # checks the values
        top = self.signal_layers - 1  # the highest watched layer (-1: a cap of 0, nothing ever freezes)
        c_top = values[top] if top >= 0 else math.inf
        settled = False
        if self.settle is not None and math.isfinite(c_top):  # inf: the top layer has no baseline yet
            self._top_peak = max(self._top_peak, c_top)
            settled = c_top <= self.settle * self._top_peak
        if self.settle_after is not None:
            self._unsettled = self._advance(self._unsettled, values, c_top, settled=False)
        self._streaks = self._advance(self._streaks, values, c_top, settled=settled)
        self._fresh = True

    def _advance(
        self, streaks: tuple[int, ...], values: Sequence[float], c_top: float, *, settled: bool
    ) -> tuple[int, ...]:
        """``streaks`` after one interval: each layer still by the threshold, by ``settled`` (every layer) or by
        the relative test (a layer below the top that moved by at most ``relative`` times the top)."""
        new = tuple(s + 1 for s in streaks) if settled else quiet_streaks(streaks, values, self.threshold)
        top = self.signal_layers - 1
        if self.relative is None or not (math.isfinite(c_top) and c_top > 0.0):
            return new
        bound = self.relative * c_top
        return tuple(
            n if n > 0 or layer >= top or values[layer] > bound else old + 1
            for layer, (n, old) in enumerate(zip(new, streaks, strict=True))
        )

    def _ready_streaks(self, step: int) -> tuple[int, ...]:
        if self.settle_after is None or self.total_steps is None:
            return self._streaks
        return self._streaks if reached(step, self.settle_after * self.total_steps) else self._unsettled

    def observe_eval(self, loss: float) -> None:
        """Update the held-out guard with a held-out loss."""
        self.guard.observe(loss)

    def _signal_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"threshold": self.threshold}
        # only when set, so that the snapshots of runs without them still load
        options = (("relative", self.relative), ("settle", self.settle), ("settle_after", self.settle_after))
        config.update({k: v for k, v in options if v is not None})
        if self.settle_after is not None:
            config["total_steps"] = self.total_steps
        return config

    def _signal_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {} if self.settle is None else {"top_peak": self._top_peak}
        if self.settle_after is not None:
            state["unsettled"] = list(self._unsettled)
        return state

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
        if self.settle_after is not None:
            unsettled = state.get("unsettled")
            if (
                not isinstance(unsettled, list)
                or len(unsettled) != self.num_layers
                or any(isinstance(u, bool) or not isinstance(u, int) or u < 0 for u in unsettled)
            ):
                raise FreezeError(
                    f"Drift.load_state_dict: unsettled {unsettled!r} in the snapshot, expected {self.num_layers} "
                    "counts >= 0"
                )
            self._unsettled = tuple(unsettled)
        return streaks
