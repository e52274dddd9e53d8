"""The freeze-policy protocol: the plug-in point for deciding how many leading layers are frozen.

A policy is any object with these members (no base class needed). The caller - the orchestrator, or a plain
training loop - feeds it per-layer statistics with :meth:`FreezePolicy.observe` and asks at a decision point
(typically the start of an epoch) with :meth:`FreezePolicy.propose`. :func:`decide` asks and checks the answer, so
a faulty custom policy fails loudly instead of unfreezing layers or freezing past the end.

Timeline of one job, with decisions at epoch starts::

    epoch 0: train ... tracker.accumulate() per step ... policy.observe(stats)
    epoch 1: frozen = decide(policy, epoch=1, step=s, current=frozen) -> freeze_modules(newly frozen, optimizer)
    ...
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from elastic_pipe.freeze.errors import FreezeError
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["FreezePolicy", "check_config", "check_current", "check_num_layers", "decide"]


@runtime_checkable
class FreezePolicy(Protocol):
    """Decides the number of frozen leading layers of a model with ``num_layers`` freezable layers.

    Attributes:
        num_layers: number of freezable layers L (an input, never hard-coded).
        can_unfreeze: whether :meth:`propose` may return less than ``current``; False for every built-in policy.
    """

    num_layers: int
    can_unfreeze: bool

    def observe(self, stats: LayerStats) -> None:
        """Take in per-layer statistics gathered since the previous observation."""
        ...

    def propose(self, epoch: int, step: int, current: int) -> int:
        """Return the frozen count wanted now, in ``[0, num_layers]``, ``>= current`` unless ``can_unfreeze``.

        Args:
            epoch: the epoch about to run (0-based).
            step: global optimizer steps completed so far.
            current: leading layers frozen right now.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serializable snapshot that :meth:`load_state_dict` restores exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by :meth:`state_dict` (of a policy with the same configuration)."""
        ...


def check_num_layers(owner: str, num_layers: int) -> None:
    """Raise :class:`FreezeError` unless ``num_layers`` is an int >= 1."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise FreezeError(f"{owner}: num_layers must be an integer >= 1, got {num_layers!r}")


def check_current(owner: str, num_layers: int, current: int) -> None:
    """Raise :class:`FreezeError` unless ``0 <= current <= num_layers``."""
    if not 0 <= current <= num_layers:
        raise FreezeError(f"{owner}: current frozen count must be in [0, {num_layers}], got {current}")


def check_config(owner: str, state: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise :class:`FreezeError` if a snapshot's configuration differs from this policy's.

    A snapshot carries its policy's name and configuration, so that a checkpoint of one policy is never loaded
    into another silently.
    """
    for key, value in expected.items():
        if state.get(key) != value:
            raise FreezeError(f"{owner}.load_state_dict: {key}={state.get(key)!r} in the snapshot, expected {value!r}")


def decide(policy: FreezePolicy, epoch: int, step: int, current: int) -> int:
    """Ask ``policy`` for its frozen count and check the answer.

    Args:
        policy: any :class:`FreezePolicy`.
        epoch: the epoch about to run (0-based).
        step: global optimizer steps completed so far.
        current: leading layers frozen right now.

    Returns:
        The proposed frozen count.

    Raises:
        FreezeError: bad ``epoch``/``step``/``current``, or the proposal is outside ``[0, num_layers]``, not an
            integer, or below ``current`` for a policy that cannot unfreeze.
    """
    name = type(policy).__name__
    if epoch < 0 or step < 0:
        raise FreezeError(f"{name}: epoch and step must be >= 0, got epoch={epoch} step={step}")
    check_current(name, policy.num_layers, current)
    proposal = policy.propose(epoch, step, current)
    if isinstance(proposal, bool) or not isinstance(proposal, int):
        raise FreezeError(f"{name}.propose returned {proposal!r}, expected an int")
    if not 0 <= proposal <= policy.num_layers:
        raise FreezeError(f"{name}.propose returned {proposal}, expected a count in [0, {policy.num_layers}]")
    if proposal < current and not policy.can_unfreeze:
        raise FreezeError(
            f"{name}.propose returned {proposal} < current {current}, but the policy declares can_unfreeze=False"
        )
    return proposal
