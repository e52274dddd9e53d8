"""Checks that need the registries, the model, the file system or the node's devices, run before any process or
group exists.

:class:`~elastic_pipe.orchestrator.config.TrainConfig` already refuses structurally impossible runs and numbers
above their named limits; here every directory the run writes (``[checkpoint] dir``, ``[log] dir``, the activation
cache's ``[pipeline] cache_tiers`` directories) must be creatable and writable, ``[log] tensorboard`` needs the
``tensorboard`` package, ``nccl`` needs a CUDA device per local rank, every component the config names is built
once on the CPU (:func:`components_from_config`: an unknown policy, solver, schedule, model or dataset, an import
path that does not import, or a solver that is not callable, is a one-line error), the initial pipeline is checked
against the model and computed once with the configured solver (and, for a user's solver or compression rule, once
more after a first decision: one that raises is named here, not at the workers' first layout or decision), a user's
freeze policy that reads no statistics is asked for its first decision, the training split must hold one global
batch, and a checkpoint to resume from is checked against the model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from elastic_pipe import freeze
from elastic_pipe.orchestrator.components import Components, components_from_config, epoch_steps
from elastic_pipe.orchestrator.data import eval_count, num_samples
from elastic_pipe.orchestrator.errors import ConfigError, one_line
from elastic_pipe.orchestrator.launch.process_group import choose_backend, local_ranks
from elastic_pipe.orchestrator.layout import frozen_sublayers, next_layout, virtual_rule
from elastic_pipe.orchestrator.persist import candidate_manifests, check_compatible, rerun
from elastic_pipe.orchestrator.report import tensorboard_missing
from elastic_pipe.orchestrator.setup import check_memory_budget, memory_budget, planned_start, sublayer_costs

if TYPE_CHECKING:
    from elastic_pipe.models import SubLayerModel
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = [
    "Facts",
    "check_batch_fits",
    "check_layouts",
    "check_policy_decides",
    "check_writable",
    "preflight",
    "resume_meta",
]


class Facts(TypedDict):
    """What :func:`preflight` learns about the run's model, and the checkpoint a resume would start from."""

    sublayers: int
    units: int
    params: int
    resume: Mapping[str, object] | None


def check_writable(directory: str | Path, what: str) -> None:
    """Create ``directory`` if needed, then create and remove a probe file in it.

    Raises:
        ConfigError: naming ``what``, the path and the operating system's reason.
    """
    path = Path(directory)
    probe = path / f".elastic_pipe_probe_{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not a writable directory: {exc.strerror or exc}") from None


def preflight(config: TrainConfig) -> Facts:
    """Check ``config`` against the registries, the model and any checkpoint; returns facts about the model.

    Returns:
        ``{"sublayers": n, "units": u, "params": p, "resume": manifest or None}`` (:func:`resume_meta`).

    Raises:
        ConfigError: naming the bad value and the valid choices.
    """
    for section, directory in (("checkpoint", config.checkpoint.dir), ("log", config.log.dir)):
        if directory:
            check_writable(directory, f"[{section}] dir")
    if config.pipeline.cache != "off":  # the activation cache's directories, before any worker maps a file there
        tiers = config.pipeline.cache_tiers
        for key, directory in (("disk", tiers.get("disk", "")), ("host_dir", tiers.get("host_dir", ""))):
            if directory:
                check_writable(directory, f"[pipeline] cache_tiers.{key}")
    if config.log.tensorboard and (missing := tensorboard_missing()) is not None:
        raise ConfigError(missing)
    choose_backend(config.launch.backend, torch.cuda.device_count(), local_ranks(config))
    p = config.pipeline
    if p.compression == "halving" and p.pipe_len & (p.pipe_len - 1):
        raise ConfigError(f"compression 'halving' needs a power-of-two pipe_len, got {p.pipe_len}")
    parts = components_from_config(config)
    model = parts.model
    sublayers = len(list(model.children()))
    units = len(model.unit_ends)
    if p.pipe_len > sublayers:
        raise ConfigError(
            f"pipe_len={p.pipe_len} is longer than the model: {config.model.name!r} has {sublayers} sub-layers"
        )
    check_memory_budget(config, model)  # [pipeline] memory_budget: some reachable length must fit
    check_layouts(config, parts)
    check_policy_decides(config, parts)
    check_batch_fits(config, parts)
    resume = resume_meta(config, model)
    return {
        "sublayers": sublayers,
        "units": units,
        "params": sum(q.numel() for q in model.parameters()),
        "resume": resume,
    }


def check_layouts(config: TrainConfig, parts: Components) -> None:
    """Compute the run's first layout as rank 0 will (the configured solver over the model's sub-layer costs) and,
    when the solver or the compression rule is the user's (an import path), the layout after a first decision that
    freezes one unit (the rule, then the solver again).

    Raises:
        ConfigError: a user's solver or rule raised, naming its key and the exception.
    """
    p = config.pipeline
    named = (("solver", p.solver), ("compression", p.compression))
    users = [f"[pipeline] {key} {spec!r}" for key, spec in named if ":" in spec]  # import paths: the user's code
    where = "the initial layout"
    try:
        layout, budget = planned_start(config, parts)
        unit_ends = list(parts.model.unit_ends)
        if users and len(unit_ends) > 1:
            where = "the layout after freezing one unit"
            next_layout(
                layout,
                frozen_sublayers(unit_ends, 1),
                sublayer_costs(parts.model),
                compression=parts.compression,
                solver=parts.partitioner,
                budget=budget,
                world_size=config.world_size,
                microbatches_for=config.microbatches_for,
                memory=memory_budget(config, parts.model),
                virtual=virtual_rule(config.pipeline.virtual, parts.schedule),
            )
    except Exception as exc:  # a user's solver or rule may raise anything
        if not users:
            raise  # a built-in's refusal is already one line about the config
        raise ConfigError(
            f"{' or '.join(users)} failed on {where}: {type(exc).__name__}: {one_line(str(exc))}"
        ) from None


def check_policy_decides(config: TrainConfig, parts: Components) -> None:
    """Ask a user's freeze policy (an import path) that reads no statistics for the run's first decision, as the
    dry run does (the policy object is this check's own; the workers build theirs).

    Raises:
        ConfigError: the policy raised or answered something that is not a frozen count, naming ``[freeze] policy``.
    """
    spec = config.freeze.policy
    if ":" not in spec or parts.policy.needs_stats:
        return  # a policy that reads gradient statistics has none to read here
    step = epoch_steps(config, num_samples(parts.data), own_eval=parts.eval_data is not None) or 1
    try:
        freeze.decide(parts.policy, 1, step, 0)
    except Exception as exc:  # a user's policy may raise anything
        raise ConfigError(
            f"freeze policy {spec!r} ([freeze] policy) failed on the first decision (epoch 1, step {step}, nothing "
            f"frozen): {type(exc).__name__}: {one_line(str(exc))}"
        ) from None


def check_batch_fits(config: TrainConfig, parts: Components) -> None:
    """The training split (the dataset less what ``[data] eval_fraction`` holds out, unless there is an
    ``eval_dataset``) must hold one ``train.global_batch``.

    Raises:
        ConfigError: naming ``train.global_batch``, the split's size and the dataset.
    """
    samples = num_samples(parts.data)
    held = 0 if parts.eval_data is not None else eval_count(samples, config.data.eval_fraction)
    if samples - held < config.train.global_batch:
        out = f", {held} of its {samples} held out by data.eval_fraction" if held else ""
        raise ConfigError(
            f"train.global_batch = {config.train.global_batch} exceeds the {samples - held} training samples of "
            f"[data] dataset {config.data.dataset!r}{out}: lower train.global_batch or give more data"
        )


def resume_meta(config: TrainConfig, model: SubLayerModel) -> Mapping[str, object] | None:
    """The manifest of the checkpoint a resume would start from: the newest one made for this model (a newer one
    whose fingerprint differs is damaged or another run's: the workers skip it, with a warning), checked against the
    config; ``None`` when there is nothing to resume.

    Raises:
        ConfigError: the checkpoints there are all another model's, or the config differs from the checkpoint's.
    """
    if not config.checkpoint.dir or config.checkpoint.resume != "auto":
        return None
    refusals = []
    for meta in candidate_manifests(config.checkpoint.dir):  # manifests newest first, else latest.json
        try:
            check_compatible(meta, model, config.checkpoint.dir)
        except ConfigError as exc:
            refusals.append(exc)
            continue
        rerun.check_config(meta, config)  # a config the checkpoint's run did not have: one line
        return meta
    if refusals:
        raise refusals[0]
    return None
