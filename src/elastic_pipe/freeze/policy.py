"""The freeze-policy protocol: the plug-in point for deciding how many leading layers are frozen.

A policy is any object with these members (no base class needed); :class:`~elastic_pipe.freeze.Policy` gives all
but ``propose`` defaults, and :func:`~elastic_pipe.freeze.as_policy` completes an object that has only
``num_layers`` and ``propose``, or a plain function ``(epoch, step, current) -> int``. The caller - the
orchestrator, or a plain training loop - feeds it per-layer gradient statistics with
:meth:`FreezePolicy.observe` (only if :attr:`FreezePolicy.needs_stats`), the held-out loss with
:meth:`FreezePolicy.observe_eval`, and asks at a decision point (typically the start of an epoch) with
:meth:`FreezePolicy.propose`. :func:`decide` asks and checks the answer,
so a faulty custom policy fails loudly instead of unfreezing layers or freezing past the end.

Thawing is not supported: every policy is monotone, and :func:`decide` raises :class:`FreezeError` for a proposal
below the current count. Freezing is not reversible where it matters: :func:`~elastic_pipe.freeze.freeze_modules`
drops a frozen parameter's optimizer state (moments, step counts), the orchestrator caches the frozen prefix's
activations and lays out the pipeline over the active layers only. A thawed layer would restart with a blank
optimizer state over stale cached activations, so the protocol has no ``can_unfreeze`` switch to ask for it.

Timeline of one job, with decisions at epoch starts::

    epoch 0: train ... tracker.accumulate() per step ... policy.observe(stats); policy.observe_eval(held-out loss)
    epoch 1: frozen = decide(policy, epoch=1, step=s, current=frozen) -> freeze_modules(newly frozen, optimizer)
    ...
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from elastic_pipe.freeze.errors import CHECK, FreezeError, FreezeTypeError
from elastic_pipe.freeze.probe import ProbePolicy
from elastic_pipe.freeze.stats import LayerStats

__all__ = [
    "MAX_LAYERS",
    "MEMBERS",
    "DecisionRhythm",
    "FreezePolicy",
    "SignalCap",
    "check_config",
    "check_current",
    "check_num_layers",
    "check_policy",
    "check_positive_int",
    "decide",
    "decisions_per_epoch",
    "needs_probe",
    "signal_layers",
]

#: Every member a runtime reads, in the order of :class:`FreezePolicy`; :func:`check_policy` names the missing ones.
#: The most freeze units a policy takes: far beyond any model (a 1000-block transformer split into sub-layers has a
#: few thousand), and it keeps a typo such as ``10**19`` from reaching the per-layer state a policy allocates.
MAX_LAYERS = 1_000_000

MEMBERS = (
    "name",
    "needs_stats",
    "num_layers",
    "observe",
    "observe_eval",
    "propose",
    "state_dict",
    "load_state_dict",
)


@runtime_checkable
class FreezePolicy(Protocol):
    """Decides the number of frozen leading layers of a model with ``num_layers`` freezable layers.

    ``name`` and ``needs_stats`` are read-only: a class attribute (as every built-in declares them), an instance
    attribute or a property satisfies them.

    Attributes:
        num_layers: number of freezable layers L (an input, never hard-coded).
    """

    num_layers: int

    @property
    def name(self) -> str:
        """Short registry-style name (``"alpha"``, ``"converged"``); snapshots and error messages carry it."""
        ...

    @property
    def needs_stats(self) -> bool:
        """Whether :meth:`observe` needs gradient statistics. Schedules say False, and a runtime then neither
        accumulates gradients per step nor gathers statistics per decision (it need not call :meth:`observe`)."""
        ...

    def observe(self, stats: LayerStats) -> None:
        """Take in per-layer statistics gathered since the previous observation."""
        ...

    def observe_eval(self, loss: float) -> None:
        """Take in the held-out loss measured after a decision interval (schedules ignore it)."""
        ...

    def propose(self, epoch: int, step: int, current: int) -> int:
        """Return the frozen count wanted now, in ``[current, num_layers]`` (policies never thaw).

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


@runtime_checkable
class SignalCap(Protocol):
    """The optional capability of a policy that never freezes past a cap (``converged``, ``settled`` and ``drift``
    have it): the runtime watches only the layers below ``signal_layers`` (:func:`signal_layers`)."""

    @property
    def signal_layers(self) -> int:
        """Leading layers whose signal the policy ever reads (a class attribute, an attribute or a property)."""
        ...


@runtime_checkable
class DecisionRhythm(Protocol):
    """The optional capability of a policy that asks for its own number of decision points per epoch
    (:class:`~elastic_pipe.freeze.Drift`: 4); :func:`decisions_per_epoch` reads it."""

    @property
    def decisions_per_epoch(self) -> int:
        """Decision points per epoch (a class attribute, an attribute or a property)."""
        ...


def check_policy(owner: str, obj: object) -> None:
    """Raise :class:`FreezeError` naming the :data:`MEMBERS` that ``obj`` lacks, if it is no :class:`FreezePolicy`."""
    missing = [member for member in MEMBERS if not hasattr(obj, member)]
    if missing:
        raise FreezeTypeError(
            f"{owner}: policy {obj!r} lacks the FreezePolicy members {missing}; expected all of {list(MEMBERS)}"
        )


def check_num_layers(owner: str, num_layers: int) -> None:
    """Raise :class:`FreezeError` unless ``num_layers`` is an int in ``[1, MAX_LAYERS]``."""
    CHECK.int(f"{owner}: num_layers", num_layers, lo=1, hi=MAX_LAYERS)


def check_positive_int(owner: str, key: str, value: int) -> None:
    """Raise :class:`FreezeError` naming ``owner`` and option ``key`` unless ``value`` is an int >= 1."""
    CHECK.int(f"{owner}: {key}", value, lo=1)


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
        The proposed frozen count, in ``[current, policy.num_layers]``.

    Raises:
        FreezeError: ``policy`` lacks protocol members, bad ``epoch``/``step``/``current``, or the proposal is not
            an integer, outside ``[0, num_layers]``, or below ``current`` (thawing is not supported).
    """
    check_policy("decide", policy)
    owner = f"freeze policy {policy.name!r} ({type(policy).__name__})"
    CHECK.int(f"{owner}: epoch", epoch)
    CHECK.int(f"{owner}: step", step)
    CHECK.int(f"{owner}: current", current)
    check_current(owner, policy.num_layers, current)
    proposal = policy.propose(epoch, step, current)
    if isinstance(proposal, bool) or not isinstance(proposal, int):
        raise FreezeError(f"{owner}: propose returned {proposal!r}, expected an int")
    if not 0 <= proposal <= policy.num_layers:
        raise FreezeError(f"{owner}: propose returned {proposal}, expected a count in [0, {policy.num_layers}]")
    if proposal < current:
        raise FreezeError(
            f"{owner}: propose returned {proposal} < current {current}; expected a count in "
            f"[{current}, {policy.num_layers}] (policies are monotone: thawing is not supported)"
        )
    return proposal


def signal_layers(policy: FreezePolicy) -> int:
    """Leading layers whose signal (gradient statistics or probe drift) ``policy`` ever reads.

    A policy that never freezes past a cap may say so with the optional ``signal_layers`` capability
    (:class:`SignalCap`; ``converged``, ``settled`` and ``drift`` have it); the runtime then watches only the layers
    below it. Without one, or with one that is not an integer: all ``num_layers``. Always in ``[0, num_layers]``.
    """
    CHECK.int("signal_layers: policy.num_layers", getattr(policy, "num_layers", None))  # a required member, checked
    limit = policy.signal_layers if isinstance(policy, SignalCap) else None
    n = int(policy.num_layers)
    if isinstance(limit, bool) or not isinstance(limit, int):
        return n
    return max(0, min(limit, n))


def needs_probe(policy: FreezePolicy) -> bool:
    """Whether ``policy`` reads the output drift of a fixed probe batch: it has the optional probe capability
    (:class:`~elastic_pipe.freeze.probe.ProbePolicy`: ``needs_probe`` and a callable ``observe_drift(change)``,
    as :class:`~elastic_pipe.freeze.Drift` has) and its ``needs_probe`` is true; False without it."""
    return isinstance(policy, ProbePolicy) and bool(policy.needs_probe) and callable(policy.observe_drift)


def decisions_per_epoch(policy: object) -> int:
    """How many decision points per epoch ``policy`` asks for: its optional ``decisions_per_epoch`` integer
    (:class:`DecisionRhythm`; :class:`~elastic_pipe.freeze.Drift`: 4, the rhythm its defaults were measured at),
    else 1 (after every epoch, the published rhythm). A value that is not an integer >= 1 counts as 1."""
    n = policy.decisions_per_epoch if isinstance(policy, DecisionRhythm) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
