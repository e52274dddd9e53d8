"""Helpers shared by the model builders: config validation, preset lookup, seeded initialization."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from elastic_pipe.models.errors import ModelError

__all__ = ["INIT_STD", "build_seeded", "check_positive", "check_probability", "resolve_config"]

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
def _init_(model: nn.Module, generator: torch.Generator) -> None:
    norm_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, param in model.named_parameters():
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
    _init_(model, generator)
    return model.to(dtype)
