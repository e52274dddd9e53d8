"""Helpers shared by the model builders: config validation, preset lookup, building around loaded weights."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from elastic_pipe.models.errors import ModelError, ModelTypeError
from elastic_pipe.models.residency import MappingReader
from elastic_pipe.models.sublayer import SubLayerModel
from elastic_pipe.models.weights import CheckpointInit, MissingInit, build_seeded, identity_map, materialize_sublayers

__all__ = [
    "build_loaded",
    "build_seeded",
    "resolve_config",
]

C = TypeVar("C")
M = TypeVar("M", bound=nn.Module)


def resolve_config(config: C | str, presets: Mapping[str, C], config_type: type[C], overrides: dict[str, Any]) -> C:
    """A config from a preset name or an instance, with keyword overrides applied (and re-validated).

    Raises:
        ModelError: for an unknown preset (listing the known ones) or an unknown override field.
    """
    if not isinstance(config, str | config_type):
        raise ModelTypeError(f"config must be a {config_type.__name__} or a preset name, got {config!r}")
    if isinstance(config, str):
        if config not in presets:
            raise ModelError(f"unknown {config_type.__name__} preset {config!r}; expected one of {sorted(presets)}")
        config = presets[config]
    if not isinstance(config, config_type):
        raise ModelError(f"expected a {config_type.__name__} or a preset name, got {config!r}")
    if not overrides:
        return config
    fields = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ModelError(f"unknown {config_type.__name__} fields {unknown}; expected some of {sorted(fields)}")
    return dataclasses.replace(config, **overrides)  # type: ignore[type-var]


def build_loaded(
    factory: Callable[[], M], weights: Mapping[str, torch.Tensor], seed: int, dtype: torch.dtype
) -> tuple[M, list[str]]:
    """Build a model holding ``weights``; parameters they lack are drawn from one generator seeded by ``seed``
    (:class:`~elastic_pipe.models.weights.MissingInit`).

    The model is first built on the meta device, so no time goes into initializing weights that get overwritten.
    It comes back with every tensor on the CPU and no ``sublayer_init`` (it needs none).

    Returns:
        The model and the sorted names of the parameters that were initialized rather than loaded.

    Raises:
        ModelError: if ``weights`` names a tensor the model does not have or has the wrong shape for it.
    """
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = factory().to(dtype)
    own = model.state_dict(keep_vars=True)
    extra = sorted(set(weights) - set(own))
    if extra:
        raise ModelError(f"weights name tensors the model does not have: {extra}")
    for key, value in weights.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ModelError(f"weight {key!r} has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}")
    missing = sorted(set(own) - set(weights))
    if not isinstance(model, SubLayerModel):
        raise ModelError(f"build_loaded needs a SubLayerModel factory, got {type(model).__name__}")
    fallback = MissingInit(seed, missing)
    model.sublayer_init = CheckpointInit(
        lambda: contextlib.nullcontext(MappingReader(weights)), identity_map(weights), fallback
    )
    materialize_sublayers(model, range(model.num_sublayers), "cpu")
    model.sublayer_init = None
    return model, missing
