"""The machinery shared by the streak-driven freeze policies (:class:`~elastic_pipe.freeze.Converged`,
:class:`~elastic_pipe.freeze.Settled`, :class:`~elastic_pipe.freeze.Drift`).

Each of them reads one per-layer signal at every decision point, turns it into a count of consecutive quiet
observations per layer (its *streak*) and freezes through the leading layers whose streak has reached
``patience``::

    ready     = leading active layers current, current+1, ... with streak >= patience, stopping at the first other
    proposal  = current + min(ready, max_step, cap - current)               cap = floor(max_fraction * L)

One decision per observation (without a new one since the last :meth:`StreakPolicy.propose`, nothing new is
frozen), and none while the held-out guard (:class:`~elastic_pipe.freeze.guard.HeldOutGuard`) holds.
:class:`StreakPolicy` owns the options, the streaks, the guard and the snapshot; a subclass adds only its signal:
its option (checked, then handed to the base), the ``observe`` method that updates ``_streaks`` and sets
``_fresh``, and the hooks that put its option and state into the configuration and the snapshot. Each subclass
also declares its own ``observe_eval`` (one line, into ``guard``): every built-in declares the protocol's methods
on its class (tests/test_freeze_policies.py checks it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from elastic_pipe.freeze._numeric import floor_tolerant
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.guard import HeldOutGuard
from elastic_pipe.freeze.policy import check_config, check_current, check_num_layers, check_positive_int

__all__ = ["StreakPolicy", "check_max_fraction", "converged_prefix", "max_frozen"]


def check_max_fraction(owner: str, max_fraction: float) -> None:
    """Raise :class:`FreezeError` naming ``owner`` unless ``max_fraction`` is a number in (0, 1] (every policy that
    caps its frozen count checks its option here)."""
    max_fraction = CHECK.number(f"{owner}: max_fraction", max_fraction)
    if not (math.isfinite(max_fraction) and 0.0 < max_fraction <= 1.0):
        raise FreezeError(f"{owner}: max_fraction must be in (0, 1], got {max_fraction!r}")


def max_frozen(num_layers: int, max_fraction: float) -> int:
    """The most layers the policy ever freezes: ``floor(max_fraction * num_layers)``, robust to float noise."""
    return floor_tolerant(max_fraction * num_layers)


def converged_prefix(streaks: Sequence[int], current: int, patience: int, cap: int, max_step: int) -> int:
    """The frozen count after one decision: extend ``current`` through the converged layers that follow it.

    Args:
        streaks: per layer, consecutive quiet observations.
        current: leading layers frozen now.
        patience: quiet observations a layer needs to count as converged.
        cap: never freeze past this count.
        max_step: freeze at most this many new layers.

    Returns:
        ``current`` plus the number of consecutive layers from ``current`` on whose streak is at least
        ``patience``, at most ``max_step`` of them and never past ``cap``; ``current`` if it is at the cap or past it.
    """
    new = current
    while new < min(cap, current + max_step, len(streaks)) and streaks[new] >= patience:
        new += 1
    return new


class StreakPolicy(ABC):
    """Base of a policy that freezes the next leading layers once their streaks reach ``patience``.

    A subclass checks its own signal option first (after ``num_layers``, so that the first bad option named stays
    the same), then calls this constructor.

    Args:
        num_layers: freezable layers L.
        patience: consecutive quiet observations a layer needs (>= 1).
        max_fraction: never freeze more than ``floor(max_fraction * L)`` layers, in (0, 1].
        max_step: at most this many new layers per decision (>= 1).
        tolerance: the held-out guard's tolerance (>= 0); None turns it off.
        plateau: the guard's plateau (see :class:`~elastic_pipe.freeze.guard.HeldOutGuard`); None: no wait.

    Raises:
        FreezeError: an option outside its range, the message naming the policy (:attr:`owner`).
    """

    name: ClassVar[str]
    needs_stats: ClassVar[bool]
    #: The policy's class name, which every error message starts with.
    owner: ClassVar[str]
    #: Whether the configuration (snapshot and ``repr``) carries the guard's ``plateau``.
    has_plateau: ClassVar[bool] = True

    def __init__(
        self,
        num_layers: int,
        *,
        patience: int,
        max_fraction: float,
        max_step: int,
        tolerance: float | None,
        plateau: float | None = None,
    ) -> None:
        check_num_layers(self.owner, num_layers)
        check_positive_int(self.owner, "patience", patience)
        check_max_fraction(self.owner, max_fraction)
        check_positive_int(self.owner, "max_step", max_step)
        self.num_layers = num_layers
        self.patience = patience
        self.max_fraction = float(max_fraction)
        self.max_step = max_step
        self.guard = HeldOutGuard(tolerance, self.owner, plateau=plateau)
        self._streaks: tuple[int, ...] = (0,) * num_layers
        self._fresh = False  # an observation arrived since the last decision

    @property
    def tolerance(self) -> float | None:
        """The guard's tolerance (None: no guard)."""
        return self.guard.tolerance

    @property
    def cap(self) -> int:
        """The most layers the policy ever freezes: ``floor(max_fraction * num_layers)``."""
        return max_frozen(self.num_layers, self.max_fraction)

    @property
    def signal_layers(self) -> int:
        """Leading layers whose signal the policy ever reads (those up to the cap, unless the signal reads more):
        the runtime need not measure the others."""
        return self.cap

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value}" for key, value in self._config().items() if key != "policy")
        return f"{self.owner}({options})"

    def propose(self, epoch: int, step: int, current: int) -> int:
        """Freeze through the quiet layers after ``current`` (see the module docstring); one decision per
        observation, none while the guard holds."""
        check_current(self.owner, self.num_layers, current)
        fresh, self._fresh = self._fresh, False
        if not fresh or self.guard.held:
            return current
        return converged_prefix(self._ready_streaks(step), current, self.patience, self.cap, self.max_step)

    def _ready_streaks(self, step: int) -> tuple[int, ...]:
        """The streaks a decision at ``step`` reads: ``_streaks`` unless the signal says otherwise."""
        return self._streaks

    @abstractmethod
    def _signal_config(self) -> dict[str, Any]:
        """The signal's options, placed after ``num_layers`` in the configuration."""

    def _signal_state(self) -> dict[str, Any]:
        """The signal's own state (plain JSON), placed before the streaks in the snapshot; none by default."""
        return {}

    @abstractmethod
    def _load_signal(self, state: dict[str, Any]) -> tuple[int, ...]:
        """Check a snapshot's streaks and the signal's own state, restore the latter, and return the streaks.

        Raises:
            FreezeError: streaks (or signal state) that do not cover ``num_layers`` layers.
        """

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "policy": self.name,
            "num_layers": self.num_layers,
            **self._signal_config(),
            "patience": self.patience,
            "max_fraction": self.max_fraction,
            "max_step": self.max_step,
            "tolerance": self.tolerance,
        }
        if self.has_plateau:
            config["plateau"] = self.guard.plateau
        return config

    def state_dict(self) -> dict[str, Any]:
        """Configuration plus the signal's state, the streaks, whether a decision is due and the guard's state
        (``best`` and ``held``): plain JSON."""
        return {
            **self._config(),
            **self._signal_state(),
            "streaks": list(self._streaks),
            "fresh": self._fresh,
            **self.guard.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot of the same policy with the same configuration.

        Raises:
            FreezeError: a snapshot of another policy or configuration, or one whose streaks (or signal state) do
                not cover ``num_layers`` layers.
        """
        check_config(self.owner, state, self._config())
        self._streaks = self._load_signal(state)
        self._fresh = bool(state["fresh"])
        self.guard.load_state_dict(state)
