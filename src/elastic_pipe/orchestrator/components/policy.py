"""The freeze policy a config names (a registry name, an import path of a factory, or a plain function), and the one
place a user's policy is made a full :class:`~elastic_pipe.freeze.FreezePolicy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_pipe import freeze
from elastic_pipe.orchestrator.components.lookup import resolve
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.types import ElasticPipeError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["adapt_policy", "make_policy"]


def make_policy(config: TrainConfig, num_units: int, *, total_steps: int | None = None) -> freeze.FreezePolicy:
    """The config's freeze policy over ``num_units`` units (registry name or import path of a factory).

    Args:
        config: the run's config.
        num_units: the model's freeze units.
        total_steps: the run's optimizer steps (:func:`run_steps`): the ``total_steps`` of a policy that takes one
            (FreezeOut, Drift) when the config gives none.

    Raises:
        ConfigError: an unknown name, options the factory does not take, or an object that is not a policy.
    """
    spec = config.freeze.policy
    factory = resolve(spec, freeze.POLICIES, "freeze policy")
    options = config.freeze.policy_options
    if spec not in freeze.POLICIES and freeze.is_policy_function(factory, **options):
        if options:
            raise ConfigError(
                f"freeze policy {spec!r} is a function (epoch, step, current) -> int, which takes no options; "
                f"got {options}"
            )
        return adapt_policy(factory, num_units, f"freeze policy {spec!r}")
    if "total_steps" not in options and total_steps is not None and freeze.takes_total_steps(factory):
        options["total_steps"] = max(1, total_steps)
    try:
        if spec in freeze.POLICIES:
            return freeze.make_policy(spec, num_units, **options)
        policy = factory(num_units, **options)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"freeze policy {spec!r} with options {options}: {exc}") from None
    return adapt_policy(policy, num_units, f"freeze policy {spec!r}")


def adapt_policy(policy: object, num_units: int, what: str = "policy") -> freeze.FreezePolicy:
    """The one place a user's policy becomes a full :class:`~elastic_pipe.freeze.FreezePolicy`
    (:func:`elastic_pipe.freeze.as_policy`: an object with ``num_layers`` and ``propose`` gets the documented
    defaults, a function ``(epoch, step, current) -> int`` is wrapped over the model's units).

    Raises:
        ConfigError: ``policy`` is none of these, or its ``num_layers`` is not the model's ``num_units`` (it counts
            freeze units, ``len(model.unit_ends)``).
    """
    try:
        full = freeze.as_policy(policy, num_units)
    except ElasticPipeError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if full.num_layers != num_units:
        raise ConfigError(
            f"{what} {full.name!r} has num_layers={full.num_layers!r}, but the model has {num_units} freeze units; "
            f"expected num_layers={num_units} (it counts units: len(model.unit_ends))"
        )
    return full
