"""A rank's share of the training state as tensors and plain data, and restoring a share on every rank.

Every rank has the run's position and the trainer's small state (scheduler, policy, sampler, history); each rank
also has the weights of the sub-layers it holds and the optimizer state of the parameters it owns, by name. A
checkpoint (:mod:`.checkpoint`) writes one such share per stage; :func:`restore` takes from a saved state - one
whole state, or shards read on demand (:class:`~elastic_pipe.orchestrator.persist.shards.ShardedCheckpoint`) -
only what this rank holds in the saved layout, whatever layout or world size wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from elastic_pipe import freeze
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.holdings import assemble, hold, point_optimizer
from elastic_pipe.orchestrator.persist.exported import inference_record
from elastic_pipe.orchestrator.state import RunState

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.persist.files import SavedState
    from elastic_pipe.types import Layout

__all__ = ["full_model", "local_state", "restore"]


def _held_keys(ctx: RunContext, layout: Layout) -> list[str]:
    return [k for j in ctx.held(layout) for k in ctx.sublayer_keys[j]]


def local_state(
    ctx: RunContext, state: RunState, optimizer: torch.optim.Optimizer, *, extra: Mapping[str, object]
) -> SavedState:
    """This rank's share of the training state (no collective), tensors on the CPU.

    Returns:
        ``{"run", "rng", "model", "optimizer", "inference", **extra}``: ``model`` holds the weights of the sub-layers
        this rank holds, ``optimizer`` the state of the parameters it owns (by name) and the hyper-parameters,
        ``inference`` what an exported model needs (:func:`.exported.inference_record`: its ``[model]`` table and
        the input standardisation or tokenizer; a resume ignores it). A released frozen prefix
        (:mod:`~elastic_pipe.orchestrator.prefix.residency`) is in rank 0's share only, which keeps it in host
        memory: rank 0 writes the stage-0 shard.
    """
    names = {id(p): name for name, p in ctx.model.named_parameters()}
    local = ctx.model.state_dict(keep_vars=True)
    return {
        "run": state.to_dict(),
        "rng": torch.get_rng_state(),
        "model": {k: local[k].detach().cpu() for k in _held_keys(ctx, state.layout) if not local[k].is_meta},
        "optimizer": {
            "state": {
                names[id(p)]: {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
                for p, s in optimizer.state.items()
            },
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
        },
        "inference": inference_record(ctx.config, ctx.train_set, ctx.parts.data),
        **extra,
    }


def restore(ctx: RunContext, optimizer: torch.optim.Optimizer, saved: SavedState) -> RunState:
    """Hold the saved layout's sub-layers, load their weights and this rank's optimizer state; returns the position.

    ``saved["model"]`` and ``saved["optimizer"]["state"]`` may be any mappings holding at least this rank's share
    (a sharded checkpoint reads only the tensors asked for).

    Raises:
        OrchestratorError: the saved pipeline length cannot run on this world size, or the saved state lacks a
            tensor this rank needs.
    """
    pipe_len = int(saved["run"]["layout"]["pipe_len"])
    if ctx.world_size % pipe_len or pipe_len not in ctx.groups.pipe_lens:
        raise OrchestratorError(
            f"the checkpoint's pipeline length {pipe_len} cannot run on {ctx.world_size} processes "
            f"(possible lengths: {list(ctx.groups.pipe_lens)})"
        )
    state = RunState.from_dict(saved["run"], ctx.world_size)
    layout = state.layout
    # every held tensor, a released frozen prefix's too, is overwritten below from the saved state: nothing to
    # initialize or read, and the prefix comes back resident (the caller tells the run's FrozenPrefix)
    hold(ctx, layout, fill=False)
    weights: Mapping[str, torch.Tensor] = saved["model"]
    local = ctx.model.state_dict(keep_vars=True)
    with torch.no_grad():
        for key in _held_keys(ctx, layout):
            if key not in weights:
                raise OrchestratorError(f"the checkpoint holds no tensor {key!r}")
            local[key].copy_(weights[key])
    sublayers = ctx.sublayers
    if layout.frozen:
        freeze.freeze_modules(sublayers[: layout.frozen], optimizer)
    point_optimizer(ctx, optimizer, layout)
    saved_state: Mapping[str, Mapping[str, object]] = saved["optimizer"]["state"]
    # A fused optimizer keeps its step count beside the parameters; the others keep it on the host.
    fused = bool(optimizer.defaults.get("fused"))
    owned = set(ctx.owned(layout))
    index = {name: j for j, (name, _) in enumerate(ctx.model.named_children())}
    for name, p in ctx.model.named_parameters():
        if index[name.split(".", 1)[0]] not in owned or not p.requires_grad:
            continue
        s = saved_state.get(name)
        if s:
            optimizer.state[p] = {
                k: (v.to(ctx.device) if isinstance(v, torch.Tensor) and (fused or k != "step") else v)
                for k, v in s.items()
            }
    for group, kept in zip(optimizer.param_groups, saved["optimizer"]["param_groups"], strict=False):
        # hyper-parameters come back; how the update runs (fused or not) is this machine's choice
        group.update({k: v for k, v in kept.items() if k not in ("fused", "foreach")})
    torch.set_rng_state(saved["rng"])
    return state


def full_model(ctx: RunContext, layout: Layout) -> dict[str, torch.Tensor]:
    """The whole trained model's weights on rank 0 (a collective: replica 0 of each stage sends its sub-layers).

    Returns:
        On rank 0 the model's ``state_dict`` with every tensor on the CPU (a copy: tied tensors come out as
        separate equal tensors, ready for ``safetensors``); ``{}`` on the other ranks.
    """
    return assemble(ctx, layout)
