"""Building one rank's :class:`RunContext`: groups, device, data splits, sub-layer costs, the event log.

The process group must exist already (:func:`elastic_pipe.orchestrator.launch.join_process_group`).

The model arrives on the meta device (the config's builders build it there, shapes and no storage) or with real
weights on the CPU (a user's model). Setup reads what every rank must know about every sub-layer without
materializing the model: the parameters' names and sizes come from the meta tensors, and the activation shapes at
each boundary (:func:`boundary_examples`) and the profiled costs (``cost = "time"``, :func:`profiled_costs`) from
running one sub-layer at a time, a meta one on zero-filled storage that is freed right after. The trainer then
materializes only what the rank holds (:func:`elastic_pipe.orchestrator.transition.hold`), so the setup's memory
grows with the rank's stage, not with the model.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import partition
from elastic_pipe.groups import GroupManager
from elastic_pipe.models.residency import materialize, release
from elastic_pipe.orchestrator.compilation import compile_enabled, compile_sublayers
from elastic_pipe.orchestrator.context import RunContext
from elastic_pipe.orchestrator.data import (
    DatasetSplit,
    StepData,
    cross_entropy,
    epoch_plan,
    local_failure,
    raise_first_failure,
    reachable_pipe_lens,
    split_data,
    split_unit,
)
from elastic_pipe.orchestrator.errors import ConfigError, OrchestratorError
from elastic_pipe.orchestrator.launch import device_for, training_backend, warm_up
from elastic_pipe.orchestrator.layout import MemoryBudget, initial_layout_within, start_layout, virtual_rule
from elastic_pipe.orchestrator.report import EventLog, TensorBoardSink
from elastic_pipe.orchestrator.transition import shared_across_sublayers, sublayer_keys

if TYPE_CHECKING:
    from elastic_pipe.models import SubLayerModel
    from elastic_pipe.orchestrator.components import Components
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.types import Layout

__all__ = [
    "boundary_examples",
    "build_context",
    "candidate_pipe_lens",
    "check_memory_budget",
    "check_untied_stages",
    "memory_budget",
    "profiled_costs",
    "sublayer_costs",
]


def candidate_pipe_lens(config: TrainConfig) -> tuple[int, ...]:
    """Every pipeline length the job may reach: divisors of the world size up to the initial length."""
    return reachable_pipe_lens(config.pipeline.pipe_len, config.world_size)


def sublayer_costs(model: nn.Module) -> list[float]:
    """Parameters per sub-layer (the published partition proxy)."""
    return [float(sum(p.numel() for p in m.parameters())) for m in model.children()]


def _is_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


@contextlib.contextmanager
def visiting(model: SubLayerModel, j: int, device: torch.device) -> Iterator[nn.Module]:
    """Sub-layer ``j`` of ``model`` on ``device`` for a moment, so that it can run there.

    A sub-layer with weights moves there and back. One on the meta device gets zero-filled storage there, freed
    when the block ends: what runs it here needs shapes, dtypes and the time of its operations, not its values, so
    nothing is initialized and no checkpoint tensor is read.
    """
    sub = list(model.children())[j]
    if _is_meta(sub):
        fresh = set(materialize(model, [j], device))
        with torch.no_grad():
            for key, t in model.state_dict(keep_vars=True).items():
                if key in fresh:
                    t.zero_()
        try:
            yield sub
        finally:
            release(model, [j])
        return
    home = next((t.device for t in (*sub.parameters(), *sub.buffers())), device)
    sub.to(device)
    try:
        yield sub
    finally:
        sub.to(home)


def profiled_costs(model: SubLayerModel, train_set: StepData, config: TrainConfig, device: torch.device) -> list[float]:
    """Forward + backward seconds per sub-layer on one micro-batch (``partition.profile_layers``), one sub-layer
    on the device at a time (:func:`visiting`), each on the previous one's output."""
    mb = max(1, config.train.global_batch // config.world_size // config.pipeline.microbatches)
    n = len(list(model.children()))
    names = getattr(model, "layer_names", [str(i) for i in range(n)])
    x = train_set.input_rows(0, mb).to(device)
    records = []
    for j in range(n):
        with visiting(model, j, device) as sub:
            records += partition.profile_layers([(names[j], sub)], x)
            with torch.no_grad():
                x = sub(x).detach()
            for p in sub.parameters():
                p.grad = None
    return partition.weights_from_costs(records, metric="time")


@torch.no_grad()
def boundary_examples(
    model: SubLayerModel, x: torch.Tensor, device: torch.device, autocast: Callable[[], torch.autocast]
) -> list[torch.Tensor]:
    """One sample's activation at every sub-layer boundary, in eval mode, on ``device``.

    Each sub-layer visits the device only while it runs (:func:`visiting`), so this needs the device memory of one
    sub-layer, not of the model. A sub-layer on the meta device runs on zeros: its examples have the right shapes
    and dtypes (all a stage declares and the cache sizes its entries by), not the model's values.

    Args:
        model: the whole model (a SubLayerModel), its weights anywhere or on the meta device.
        x: one sample's input.
        device: where the examples are computed and kept.
        autocast: returns the autocast context the forward passes run in.
    """
    was = model.training
    model.eval()
    x = x.to(device)
    out = [x]
    for j in range(len(list(model.children()))):
        with visiting(model, j, device) as sub, autocast():
            x = sub(x)
        out.append(x.detach())
    model.train(was)
    return out


def param_bytes(model: nn.Module) -> list[int]:
    """Parameter bytes per sub-layer."""
    return [sum(p.numel() * p.element_size() for p in m.parameters()) for m in model.children()]


def optimizer_slots(config: TrainConfig) -> int:
    """Parameter-sized tensors the optimizer keeps per parameter: AdamW 2, SGD 1 with momentum (else 0)."""
    if config.train.optimizer == "sgd":
        return 1 if config.train.momentum else 0
    return 2


def memory_budget(config: TrainConfig, model: nn.Module) -> MemoryBudget | None:
    """The per-rank budget ``[pipeline] memory_budget`` sets for ``model``, or ``None`` when it sets none."""
    limit = config.pipeline.memory_budget_bytes
    if limit is None:
        return None
    return MemoryBudget.for_parameters(limit, param_bytes(model), optimizer_slots(config))


def planned_start(config: TrainConfig, parts: Components) -> tuple[Layout, float]:
    """The run's first layout and its budget, computed from the config and the components alone, as rank 0 computes
    them at the start (for the dry run and the preflight; the trainer's own comes from its context)."""
    return start_layout(
        sublayer_costs(parts.model),
        candidate_pipe_lens(config),
        config.world_size,
        solver=parts.partitioner,
        microbatches_for=config.microbatches_for,
        memory=memory_budget(config, parts.model),
        virtual=virtual_rule(config.pipeline.virtual, parts.schedule),
    )


def check_untied_stages(config: TrainConfig, model: nn.Module) -> None:
    """Refuse a pipelined job whose model ties a parameter between two sub-layers (no collective).

    Raises:
        ConfigError: ``pipe_len`` > 1 and a parameter is shared by two sub-layers, naming both.
    """
    shared = shared_across_sublayers(model)
    if shared and config.pipeline.pipe_len > 1:
        a, b = shared[0]
        raise ConfigError(
            f"{a} and {b} are one tied parameter, and a pipeline holds each stage's sub-layers on its own ranks, "
            f"where the two copies would drift apart: untie them (e.g. tie_word_embeddings = false) or use "
            f"pipeline.pipe_len = 1 (got {config.pipeline.pipe_len})"
        )


def check_memory_budget(config: TrainConfig, model: nn.Module) -> None:
    """Refuse a job none of whose pipeline lengths fits ``[pipeline] memory_budget`` (no collective: called before
    the process group forms, with the parameter-count partition every length starts from).

    Raises:
        ConfigError: no reachable pipeline length fits, naming the bytes needed and the limit.
    """
    memory = memory_budget(config, model)
    if memory is None:
        return
    initial_layout_within(
        sublayer_costs(model),
        candidate_pipe_lens(config),
        config.world_size,
        memory,
        solver=config.pipeline.solver,
        microbatches_for=config.microbatches_for,
        virtual=virtual_rule(config.pipeline.virtual, config.pipeline.schedule),
    )


def build_context(config: TrainConfig, parts: Components, *, quiet: bool = False) -> RunContext:
    """This rank's fixed facts (a collective: builds and warms up every reachable group).

    Raises:
        OrchestratorError: the job's size differs from the config's, or the batch exceeds the training split.
        ConfigError: a dataset item differs from item 0 or has a class label the model's output cannot score
            (naming the first such sample, on every rank).
    """
    c = config
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != c.world_size:
        raise OrchestratorError(f"the job has {world} processes but the config describes {c.world_size}")
    device = device_for(c)
    dtype = getattr(torch, c.train.dtype)
    train_set, eval_set = split_data(
        parts.data, c.data.eval_fraction, c.train.seed, dtype, workers=c.data.workers, eval_data=parts.eval_data
    )
    if len(train_set) < c.train.global_batch:
        raise OrchestratorError(f"global_batch={c.train.global_batch} exceeds the {len(train_set)} training samples")
    groups = GroupManager(
        world,
        rank,
        candidate_pipe_lens(c),
        backend=training_backend(c),
        gpus_per_node=c.launch.nproc_per_node if c.launch.nnodes > 1 else None,
        timeout=c.launch.timeout,
    )
    groups.build()
    warm_up(groups, device)
    path = os.path.join(c.log.dir, "events.jsonl") if c.log.dir and rank == 0 else None
    sinks = [TensorBoardSink(os.path.join(c.log.dir, "tensorboard"))] if c.log.tensorboard and rank == 0 else []
    log = EventLog(path, None if quiet or rank != 0 else sys.stderr, sinks)
    model = parts.model  # stays where it is (meta, or the CPU): the trainer materializes only what this rank holds
    autocast = RunContext.autocast_for(c, device)
    examples = boundary_examples(model, train_set.input_rows(0, 1), device, autocast)
    # Class labels are checked against the model's output (cross-entropy only: a user loss may take anything).
    classes = int(examples[-1].shape[-1]) if parts.loss is cross_entropy else None
    if isinstance(train_set, DatasetSplit) and isinstance(eval_set, DatasetSplit):
        train_set, eval_set = train_set.with_classes(classes), eval_set.with_classes(classes)
    mine = local_failure([train_set, eval_set], classes, rank, world, scan=c.data.check)
    raise_first_failure(mine, rank, world, groups.broadcast_bytes)
    compiled = compile_sublayers(model) if compile_enabled(c, device) else None
    costs = sublayer_costs(model)
    if c.pipeline.cost == "time" and rank == 0:  # only rank 0 decides, so only rank 0 profiles
        costs = profiled_costs(model, train_set, c, device)
    unit = split_unit(world, candidate_pipe_lens(c), c.microbatches_for)
    epoch = epoch_plan(len(train_set), c.train.global_batch, unit, drop_last=c.data.drop_last)
    return RunContext(
        c,
        parts,
        rank,
        world,
        device,
        groups,
        train_set,
        eval_set,
        log,
        costs,
        epoch,
        compiled,
        examples=examples,
        sublayer_keys=sublayer_keys(model),
        param_bytes=param_bytes(model),
        memory=memory_budget(c, model),
    )
