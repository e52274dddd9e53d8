"""Checks that need the registries or the model, run before any process or group exists.

:class:`~elastic_pipe.orchestrator.config.TrainConfig` already refuses structurally impossible runs; here every
component the config names is built once on the CPU (:func:`components_from_config`: an unknown policy, solver,
schedule, model or dataset, or an import path that does not import, is a one-line error), the initial pipeline is
checked against the model, and a checkpoint to resume from is checked against the model.
"""

from __future__ import annotations

from typing import Any

from elastic_pipe.orchestrator.checkpoint import check_compatible, read_latest
from elastic_pipe.orchestrator.components import components_from_config
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["preflight"]


def preflight(config: TrainConfig) -> dict[str, Any]:
    """Check ``config`` against the registries, the model and any checkpoint; returns facts about the model.

    Returns:
        ``{"sublayers": n, "units": u, "params": p}``.

    Raises:
        ConfigError: naming the bad value and the valid choices.
    """
    p = config.pipeline
    if p.compression == "halving" and p.pipe_len & (p.pipe_len - 1):
        raise ConfigError(f"compression 'halving' needs a power-of-two pipe_len, got {p.pipe_len}")
    parts = components_from_config(config)
    model = parts.model
    sublayers = len(list(model.children()))
    units = len(getattr(model, "unit_ends", ()))
    if p.pipe_len > sublayers:
        raise ConfigError(
            f"pipe_len={p.pipe_len} is longer than the model: {config.model.name!r} has {sublayers} sub-layers"
        )
    if config.checkpoint.dir and config.checkpoint.resume == "auto":
        meta = read_latest(config.checkpoint.dir)
        if meta is not None:
            check_compatible(meta, model, config.checkpoint.dir)
    return {"sublayers": sublayers, "units": units, "params": sum(q.numel() for q in model.parameters())}
