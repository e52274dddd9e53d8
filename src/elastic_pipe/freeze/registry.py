"""Policies by name: the built-in ones, plus any a user registers."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeAlias

from elastic_pipe.freeze.alpha import AlphaSchedule
from elastic_pipe.freeze.autofreeze import AutoFreeze
from elastic_pipe.freeze.base import as_policy
from elastic_pipe.freeze.converged import Converged
from elastic_pipe.freeze.drift import Drift
from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.freezeout import FreezeOut
from elastic_pipe.freeze.manual import ManualSchedule, Never
from elastic_pipe.freeze.paper import PaperRule
from elastic_pipe.freeze.policy import FreezePolicy, check_num_layers
from elastic_pipe.freeze.settled import Settled

__all__ = ["POLICIES", "PolicyFactory", "make_policy", "register_policy", "takes_total_steps"]

#: Builds a policy from ``num_layers`` and keyword options.
PolicyFactory: TypeAlias = Callable[..., FreezePolicy]

#: Name -> factory. :func:`register_policy` adds to it; the CLI and the orchestrator look names up here.
POLICIES: dict[str, PolicyFactory] = {
    "alpha": AlphaSchedule,
    "paper": PaperRule,
    "autofreeze": AutoFreeze,
    "converged": Converged,
    "settled": Settled,
    "drift": Drift,
    "freezeout": FreezeOut,
    "manual": ManualSchedule,
    "never": Never,
}


def register_policy(name: str, factory: PolicyFactory, *, replace: bool = False) -> None:
    """Make ``make_policy(name, ...)`` build policies with ``factory(num_layers, **options)``.

    Raises:
        FreezeError: ``name`` is taken and ``replace`` is False, or ``name`` is empty.
    """
    if not CHECK.str("register_policy: name", name):
        raise FreezeError("register_policy: the name must be a non-empty string")
    CHECK.callable(f"register_policy: the factory for {name!r}", factory)
    if name in POLICIES and not replace:
        raise FreezeError(f"register_policy: {name!r} is already registered (pass replace=True to override)")
    POLICIES[name] = factory


def takes_total_steps(factory: PolicyFactory) -> bool:
    """Whether ``factory`` has a ``total_steps`` parameter (FreezeOut, Drift): a runtime fills it in with the run's
    optimizer steps when the options leave it out."""
    CHECK.callable("takes_total_steps: factory", factory)
    try:
        return "total_steps" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no introspectable signature
        return False


def make_policy(name: str, num_layers: int, **options: Any) -> FreezePolicy:
    """Build the policy registered as ``name``.

    Args:
        name: a key of :data:`POLICIES`.
        num_layers: freezable layers L.
        **options: the policy's own keyword arguments (``alpha=``, ``percentile=``, ``t0=``, ...).

    Raises:
        FreezeError: unknown name (the message lists the valid ones), options the policy does not take, invalid
            option values, or a factory that built an object lacking FreezePolicy members (the message names them).
    """
    CHECK.str("freeze policy name", name)
    check_num_layers(f"freeze policy {name!r}", num_layers)
    try:
        factory = POLICIES[name]
    except KeyError:
        raise FreezeError(f"unknown freeze policy {name!r}; expected one of {sorted(POLICIES)}") from None
    try:
        signature: inspect.Signature | None = inspect.signature(factory)
    except (TypeError, ValueError):  # some callables (C builtins) have no introspectable signature
        signature = None
    if signature is not None:
        try:
            signature.bind(num_layers, **options)
        except TypeError as exc:
            raise FreezeError(f"freeze policy {name!r}: {exc}; its signature is {signature}") from None
    policy = factory(num_layers, **options)
    try:  # a registered factory may build a policy with num_layers and propose only: the defaults complete it
        return as_policy(policy)
    except FreezeError as exc:
        raise FreezeError(f"freeze policy {name!r}: {exc}") from None
