"""Helpers shared by the model builders: config validation, preset lookup, seeded initialization."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from elastic_pipe.models.errors import ModelError

__all__ = [
    "INIT_STD",
    "build_loaded",
    "build_seeded",
    "check_positive",
    "check_probability",
    "init_",
    "resolve_config",
]

#: Standard deviation of the normal initialization of weights and embeddings (BERT, GPT-2 and ViT all use 0.02).
INIT_STD = 0.02
#: Truncate the initial normal at this many standard deviations, as the reference ViT/BERT code does.
_TRUNCATE_STDS = 2.0

C = TypeVar("C")
M = TypeVar("M", bound=nn.Module)


def check_positive(owner: str, **values: int) -> None:
    """Raise ModelError unless every value is an int >= 1."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{owner}.{key} must be an integer >= 1, got {value!r}")


def check_probability(owner: str, **values: float) -> None:
    """Raise ModelError unless every value is a probability in [0, 1)."""
    for key, value in values.items():
        if not 0.0 <= value < 1.0:
            raise ModelError(f"{owner}.{key} must be in [0, 1), got {value!r}")


def resolve_config(config: C | str, presets: Mapping[str, C], config_type: type[C], overrides: dict[str, Any]) -> C:
    """A config from a preset name or an instance, with keyword overrides applied (and re-validated).

    Raises:
        ModelError: for an unknown preset (listing the known ones) or an unknown override field.
    """
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


@torch.no_grad()
def init_(model: nn.Module, generator: torch.Generator, only: set[str] | None = None) -> None:
    """Initialize ``model``'s parameters (or those named in ``only``) from ``generator``.

    LayerNorm weights 1 and biases 0, other biases 0, everything else a truncated normal with :data:`INIT_STD`.
    """
    norm_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, param in model.named_parameters():
        if only is not None and name not in only:
            continue
        if id(param) in norm_params:
            param.fill_(1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias"):
            param.zero_()
        else:
            limit = _TRUNCATE_STDS * INIT_STD
            nn.init.trunc_normal_(param, std=INIT_STD, a=-limit, b=limit, generator=generator)


def build_seeded(factory: Callable[[], M], seed: int, dtype: torch.dtype) -> M:
    """Build a model and initialize it from ``seed`` alone, leaving the global RNG untouched.

    Parameters are drawn in float32 and then cast, so a float64 model holds exactly the float32 model's values.
    """
    with torch.random.fork_rng(devices=[]):
        model = factory()
    generator = torch.Generator().manual_seed(seed)
    init_(model, generator)
    return model.to(dtype)


def build_loaded(
    factory: Callable[[], M], weights: Mapping[str, torch.Tensor], seed: int, dtype: torch.dtype
) -> tuple[M, list[str]]:
    """Build a model holding ``weights``; parameters they lack are initialized from ``seed``.

    The model is first built on the meta device, so no time goes into initializing weights that get overwritten.

    Returns:
        The model and the sorted names of the parameters that were initialized rather than loaded.

    Raises:
        ModelError: if ``weights`` names a tensor the model does not have or has the wrong shape for it.
    """
    with torch.device("meta"):
        model = factory()
    model = model.to_empty(device="cpu").to(dtype)
    own = model.state_dict()
    extra = sorted(set(weights) - set(own))
    if extra:
        raise ModelError(f"weights name tensors the model does not have: {extra}")
    for key, value in weights.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ModelError(f"weight {key!r} has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}")
    missing = sorted(set(own) - set(weights))
    init_(model, torch.Generator().manual_seed(seed), only=set(missing))
    with torch.no_grad():
        for key, value in weights.items():
            own[key].copy_(value)
    return model, missing
