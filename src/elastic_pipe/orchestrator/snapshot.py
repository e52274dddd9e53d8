"""A run's training state as tensors and plain data: gathered to rank 0 for a checkpoint, restored on every rank.

The weights travel by parameter name, the optimizer's state by parameter name with its hyper-parameters, the
position as :class:`~elastic_pipe.orchestrator.state.RunState`. :class:`~elastic_pipe.orchestrator.trainer.
ElasticTrainer` adds its scheduler, policy, sampler and history; the checkpointer only writes and reads files.
"""

from __future__ import annotations

from typing import Any

import torch

from elastic_pipe import freeze
from elastic_pipe.orchestrator.context import RunContext
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.evaluation import sync_weights
from elastic_pipe.orchestrator.state import RunState
from elastic_pipe.orchestrator.transition import drop_foreign_state
from elastic_pipe.types import Layout

__all__ = ["full_model", "gather", "restore"]


def _param_names(ctx: RunContext) -> dict[int, str]:
    return {id(p): name for name, p in ctx.model.named_parameters()}


def gather(
    ctx: RunContext, state: RunState, optimizer: torch.optim.Optimizer, *, extra: dict[str, Any]
) -> dict[str, Any]:
    """The whole training state on rank 0 (a collective: every stage sends its weights and optimizer state).

    Returns:
        On rank 0: ``{"run", "rng", "model", "optimizer", **extra}``; ``{}`` elsewhere. No rank but 0 keeps
        another stage's optimizer state afterwards.
    """
    sync_weights(ctx, state.layout, optimizer, keep_all_on=0)
    if ctx.rank != 0:
        return {}
    names = _param_names(ctx)
    opt_state = {
        names[id(p)]: {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
        for p, s in optimizer.state.items()
    }
    out = {
        "run": state.to_dict(),
        "rng": torch.get_rng_state(),
        "model": {k: v.detach().cpu() for k, v in ctx.model.state_dict().items()},
        "optimizer": {
            "state": opt_state,
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
        },
        **extra,
    }
    drop_foreign_state(optimizer, ctx.sublayers, ctx.owned(state.layout))
    return out


def restore(ctx: RunContext, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> RunState:
    """Load weights, frozen prefix and this rank's share of the optimizer state; returns the saved position.

    Raises:
        OrchestratorError: the saved pipeline length cannot run on this world size.
    """
    pipe_len = int(saved["run"]["layout"]["pipe_len"])
    if ctx.world_size % pipe_len or pipe_len not in ctx.groups.pipe_lens:
        raise OrchestratorError(
            f"the checkpoint's pipeline length {pipe_len} cannot run on {ctx.world_size} processes "
            f"(possible lengths: {list(ctx.groups.pipe_lens)})"
        )
    state = RunState.from_dict(saved["run"], ctx.world_size)
    ctx.model.load_state_dict(saved["model"])
    sublayers = ctx.sublayers
    if state.layout.frozen:
        freeze.freeze_modules(sublayers[: state.layout.frozen], optimizer)
    owned = ctx.owned(state.layout)
    by_name = dict(ctx.model.named_parameters())
    # A fused optimizer keeps its step count beside the parameters; the others keep it on the host.
    fused = bool(optimizer.defaults.get("fused"))
    for name, s in saved["optimizer"]["state"].items():
        p = by_name[name]
        j = next(i for i, m in enumerate(sublayers) if any(q is p for q in m.parameters()))
        if j in owned:
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
    """The whole trained model's weights (a collective: every stage sends its sub-layers' weights).

    Returns:
        On rank 0 the model's ``state_dict`` with every tensor on the CPU (a copy: tied tensors come out as
        separate equal tensors, ready for ``safetensors``); ``{}`` on the other ranks.
    """
    sync_weights(ctx, layout)
    if ctx.rank != 0:
        return {}
    return {name: t.detach().to("cpu", copy=True) for name, t in ctx.model.state_dict().items()}
