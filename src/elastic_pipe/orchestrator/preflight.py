"""Checks that need the primitives' registries or the model, run before any process or group exists.

:class:`~elastic_pipe.orchestrator.config.TrainConfig` already refuses structurally impossible runs; here the names
are checked against the registries (freeze policy, partition solver, schedule kind), the model is built once on the
CPU to check that the initial pipeline fits it, the dataset is loaded once, and a checkpoint to resume from is
checked against the model.
"""

from __future__ import annotations

from typing import Any

from elastic_pipe import freeze, partition
from elastic_pipe import schedule as sched
from elastic_pipe.orchestrator.checkpoint import check_compatible, read_latest
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.workload import build_model, load_samples
from elastic_pipe.types import ElasticPipeError

__all__ = ["preflight"]


def preflight(config: TrainConfig) -> dict[str, Any]:
    """Check ``config`` against the registries, the model and any checkpoint; returns facts about the model.

    Returns:
        ``{"sublayers": n, "units": u, "params": p}``.

    Raises:
        ConfigError: naming the bad value and the valid choices.
    """
    if config.policy not in freeze.POLICIES:
        raise ConfigError(f"unknown freeze policy {config.policy!r}; expected one of {', '.join(freeze.POLICIES)}")
    if config.solver not in partition.SOLVERS:
        raise ConfigError(f"unknown partition solver {config.solver!r}; expected one of {', '.join(partition.SOLVERS)}")
    if config.schedule not in sched.GENERATORS:
        raise ConfigError(f"unknown schedule {config.schedule!r}; expected one of {', '.join(sched.GENERATORS)}")
    if config.compression == "halving" and config.pipe_len & (config.pipe_len - 1):
        raise ConfigError(f"compression 'halving' needs a power-of-two pipe_len, got {config.pipe_len}")
    try:
        model = build_model(config)
    except ElasticPipeError as exc:
        raise ConfigError(f"model {config.model!r} with options {dict(config.model_options)}: {exc}") from exc
    except TypeError as exc:
        raise ConfigError(f"model {config.model!r}: bad options {dict(config.model_options)}: {exc}") from exc
    sublayers = len(list(model.children()))
    units = len(getattr(model, "unit_ends", ()))
    if config.pipe_len > sublayers:
        raise ConfigError(
            f"pipe_len={config.pipe_len} is longer than the model: {config.model!r} has {sublayers} sub-layers"
        )
    try:
        freeze.make_policy(config.policy, units, **config.policy_options)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"freeze policy {config.policy!r} with options {dict(config.policy_options)}: {exc}") from exc
    try:  # a missing optional extra (scikit-learn for the digits) is a one-line error here, not a worker crash
        load_samples(config)
    except ElasticPipeError as exc:
        raise ConfigError(f"dataset {config.dataset!r}: {exc}") from exc
    if config.checkpoint_dir and config.resume == "auto":
        meta = read_latest(config.checkpoint_dir)
        if meta is not None:
            check_compatible(meta, model, config.checkpoint_dir)
    return {"sublayers": sublayers, "units": units, "params": sum(p.numel() for p in model.parameters())}
