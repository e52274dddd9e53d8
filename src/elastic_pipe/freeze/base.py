"""A custom policy needs only what it uses: :class:`Policy` gives every :class:`~.policy.FreezePolicy` member but
``propose`` a default, :func:`as_policy` completes any object with ``num_layers`` and ``propose`` (or a plain
function ``(epoch, step, current) -> int``) into a full :class:`~.policy.FreezePolicy`.

The defaults, documented once here and used by both:

* ``name``: the class's name (the function's name for a function).
* ``needs_stats``: False - the runtime gathers no gradient statistics for it and never calls ``observe``.
* ``observe(stats)``, ``observe_eval(loss)``: ignore what they are told.
* ``state_dict()``: ``{}``; ``load_state_dict(state)``: ignores it. A policy whose decisions depend on what it
  observed overrides both, so that a resumed run decides as the uninterrupted one would.

A policy written against the earlier protocol (every member but ``observe_eval``) is completed the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from elastic_pipe.freeze.errors import CHECK, FreezeError, FreezeTypeError
from elastic_pipe.freeze.policy import MEMBERS, FreezePolicy, check_num_layers
from elastic_pipe.freeze.probe import ProbePolicy
from elastic_pipe.freeze.stats import LayerStats

__all__ = [
    "REQUIRED",
    "FunctionPolicy",
    "Policy",
    "PolicyFunction",
    "PolicyLike",
    "Proposer",
    "as_policy",
    "is_policy_function",
]

#: What a custom policy object must have; every other member of :data:`~.policy.MEMBERS` has a default.
REQUIRED = ("num_layers", "propose")

#: A plain function policy: ``(epoch, step, current) -> frozen count``.
PolicyFunction: TypeAlias = Callable[[int, int, int], int]


@runtime_checkable
class Proposer(Protocol):
    """The least a policy object has: ``num_layers`` (freeze units of the model) and ``propose``."""

    num_layers: int

    def propose(self, epoch: int, step: int, current: int) -> int:
        """The frozen count wanted now (see :meth:`~.policy.FreezePolicy.propose`)."""
        ...


#: What a runtime accepts as a policy: a full :class:`~.policy.FreezePolicy`, an object with ``num_layers`` and
#: ``propose``, or a :data:`PolicyFunction`.
PolicyLike: TypeAlias = Proposer | PolicyFunction


class Policy:
    """Base class with the documented defaults (module docstring): subclass it and write ``propose``.

    Example::

        class EveryOtherEpoch(freeze.Policy):
            def propose(self, epoch: int, step: int, current: int) -> int:
                return min(epoch // 2, self.num_layers)

        policy = EveryOtherEpoch(num_layers=len(model.unit_ends))

    Args:
        num_layers: the model's freeze units (``len(model.unit_ends)``), not its parameters' layers.
    """

    needs_stats: bool = False

    def __init__(self, num_layers: int) -> None:
        check_num_layers(type(self).__name__, num_layers)
        self.num_layers = num_layers

    @property
    def name(self) -> str:
        """The class's name (a subclass may set ``name = "..."`` instead)."""
        return type(self).__name__

    def observe(self, stats: LayerStats) -> None:
        """Ignored by default."""

    def observe_eval(self, loss: float) -> None:
        """Ignored by default."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        """Subclasses decide here; the base freezes nothing more."""
        del epoch, step
        return current

    def state_dict(self) -> dict[str, Any]:
        """``{}``: nothing to keep by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Ignored by default."""
        del state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_layers={self.num_layers})"


class FunctionPolicy(Policy):
    """A :data:`PolicyFunction` as a policy over ``num_layers`` units (stateless, no statistics)."""

    def __init__(self, function: PolicyFunction, num_layers: int) -> None:
        super().__init__(num_layers)
        self.function = CHECK.callable("FunctionPolicy: function", function)

    @property
    def name(self) -> str:
        """The function's name."""
        return str(getattr(self.function, "__name__", type(self.function).__name__))

    def propose(self, epoch: int, step: int, current: int) -> int:
        """What the function returns."""
        return self.function(epoch, step, current)

    def __repr__(self) -> str:
        return f"FunctionPolicy({self.name}, num_layers={self.num_layers})"


class _Completed(Policy):
    """A policy object lacking some members, completed with the defaults; every attribute it has is its own.

    The optional capabilities (:class:`~.probe.ProbePolicy`, :class:`~.policy.SignalCap`,
    :class:`~.policy.DecisionRhythm`) are members of their own that answer with the inner object's (``None`` where
    it has none, which the runtime reads as "no capability"), so that a protocol check sees them (Python 3.12 checks
    protocols without ``__getattr__``).
    """

    def __init__(self, inner: Proposer) -> None:
        super().__init__(int(inner.num_layers))
        self.inner = inner

    def __getattr__(self, key: str) -> Any:  # only for what the adapter does not define (a policy's own fields)
        if key == "inner":
            raise AttributeError(key)
        return getattr(self.inner, key)

    @property
    def name(self) -> str:
        return str(getattr(self.inner, "name", type(self.inner).__name__))

    @property
    def needs_stats(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner, "needs_stats", False))

    def observe(self, stats: LayerStats) -> None:
        if hasattr(self.inner, "observe"):
            self.inner.observe(stats)

    def observe_eval(self, loss: float) -> None:
        if hasattr(self.inner, "observe_eval"):
            self.inner.observe_eval(loss)

    def propose(self, epoch: int, step: int, current: int) -> int:
        return self.inner.propose(epoch, step, current)

    @property
    def needs_probe(self) -> bool:
        return bool(getattr(self.inner, "needs_probe", False)) and callable(getattr(self.inner, "observe_drift", None))

    def observe_drift(self, change: Sequence[float]) -> None:
        if isinstance(self.inner, ProbePolicy):  # always, where it is asked: only when needs_probe is true
            self.inner.observe_drift(change)

    @property
    def signal_layers(self) -> object:
        return getattr(self.inner, "signal_layers", None)

    @property
    def decisions_per_epoch(self) -> object:
        return getattr(self.inner, "decisions_per_epoch", None)

    def state_dict(self) -> dict[str, Any]:
        if hasattr(self.inner, "state_dict"):
            return dict(self.inner.state_dict())
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(state)

    def __repr__(self) -> str:
        return repr(self.inner)


def is_policy_function(obj: object, **options: Any) -> bool:
    """Whether ``obj`` is a :data:`PolicyFunction` rather than a factory ``f(num_layers, **options)``: a callable,
    not a class, that takes ``(epoch, step, current)`` and cannot be called as ``f(num_layers, **options)``."""
    if isinstance(obj, type) or not callable(obj) or isinstance(obj, Proposer):
        return False
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    try:
        signature.bind(0, 0, 0)
    except TypeError:
        return False
    try:
        signature.bind(0, **options)
    except TypeError:
        return True
    return False


def as_policy(obj: object, num_layers: int | None = None) -> FreezePolicy:
    """``obj`` as a full :class:`~.policy.FreezePolicy`.

    Args:
        obj: a full policy (returned as it is), an object with ``num_layers`` and ``propose`` (completed with the
            defaults of :class:`Policy`), or a :data:`PolicyFunction`.
        num_layers: the model's freeze units; needed for a function, which has no ``num_layers`` of its own.

    Raises:
        FreezeError: ``obj`` is none of these (the message names what it lacks), or a function without
            ``num_layers``.
    """
    if all(hasattr(obj, member) for member in MEMBERS):
        return obj  # type: ignore[return-value]
    if isinstance(obj, Proposer):
        return _Completed(obj)
    if is_policy_function(obj):
        if num_layers is None:
            raise FreezeError(f"policy function {obj!r} needs num_layers (the model's freeze units)")
        return FunctionPolicy(obj, num_layers)  # type: ignore[arg-type]
    missing = [member for member in REQUIRED if not hasattr(obj, member)]
    raise FreezeTypeError(
        f"given policy {obj!r} is no freeze policy: it lacks {missing}; expected an object with {list(REQUIRED)} "
        "(freeze.Policy gives the other members defaults) or a function (epoch, step, current) -> int"
    )
