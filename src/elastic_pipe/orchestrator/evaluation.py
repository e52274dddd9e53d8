"""Scoring the whole model on the evaluation split, each rank a 1/W share, summed with one all-reduce."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.orchestrator.step_data import StepData
from elastic_pipe.orchestrator.transition import apply_moves, plan_gather
from elastic_pipe.types import Layout

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext

__all__ = ["EVAL_BATCH", "evaluate", "evaluate_split", "sync_weights"]

#: Evaluation batch size per rank.
EVAL_BATCH = 256


@torch.no_grad()
def evaluate_split(
    model: nn.Module,
    data: StepData,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    autocast: Callable[[], Any],
) -> tuple[float, float | None]:
    """Loss and accuracy of ``model`` on ``data`` (a collective); rank ``r`` scores samples ``r, r + W, ...``.

    The caller sets the model's modes (eval) and makes its weights current on every rank first.

    Args:
        model: the whole model, the same weights on every rank.
        data: the evaluation split (the same on every rank).
        loss_fn: ``loss_fn(output, target)``, a mean over the batch.
        rank: this rank.
        world_size: the number of ranks sharing the work.
        device: where the batches run.
        autocast: returns the autocast context the forward runs in.

    Returns:
        The mean loss and the accuracy (``None`` when the output is not per-sample class scores).
    """
    mine = torch.arange(rank, len(data), world_size)
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    classify = True
    chunks = [chunk.tolist() for chunk in torch.split(mine, EVAL_BATCH)]
    for chunk, x, y in data.batches(chunks, inputs=True, labels=True, device=device):
        assert x is not None and y is not None
        with autocast():
            out = model(x)
        totals[0] += float(loss_fn(out, y)) * len(chunk)
        if out.dim() == 2:
            totals[1] += float((out.argmax(-1) == y).sum())
        else:
            classify = False
        totals[2] += len(chunk)
    dist.all_reduce(totals)
    count = float(totals[2])
    return float(totals[0]) / count, (float(totals[1]) / count if classify else None)


def sync_weights(
    ctx: RunContext,
    layout: Layout,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    keep_all_on: int | None = None,
) -> int:
    """Make every rank's copy of every active sub-layer current (a collective); returns the bytes received.

    Args:
        ctx: the rank's fixed facts.
        layout: the current layout.
        optimizer: also send its state (for a checkpoint).
        keep_all_on: the rank that keeps every received optimizer state (the others keep their own only).
    """
    owned = ctx.owned(layout)
    return apply_moves(
        plan_gather(layout, ctx.plan(layout)),
        ctx.sublayers,
        optimizer,
        rank=ctx.rank,
        device=ctx.device,
        keep_state=lambda j: ctx.rank == keep_all_on or j in owned,
        broadcast_bytes=ctx.broadcast_bytes,
    )


@torch.no_grad()
def evaluate(ctx: RunContext, layout: Layout) -> tuple[float, float | None]:
    """Loss and accuracy of the whole model on the evaluation split; each rank scores a 1/W share."""
    sync_weights(ctx, layout)
    was = ctx.model.training
    ctx.model.eval()
    scores = evaluate_split(
        ctx.model,
        ctx.eval_set,
        ctx.parts.loss,
        rank=ctx.rank,
        world_size=ctx.world_size,
        device=ctx.device,
        autocast=ctx.autocast,
    )
    ctx.restore_modes(layout, was)
    return scores
