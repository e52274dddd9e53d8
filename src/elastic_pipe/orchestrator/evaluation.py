"""Scoring the whole model on the evaluation split, each rank a 1/W share, summed with one all-reduce."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.orchestrator.workload import Split

__all__ = ["EVAL_BATCH", "evaluate_split"]

#: Evaluation batch size per rank.
EVAL_BATCH = 256


@torch.no_grad()
def evaluate_split(
    model: nn.Module,
    data: Split,
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
    for chunk in torch.split(mine, EVAL_BATCH):
        x = data.inputs[chunk].to(device)
        y = data.labels[chunk].to(device)
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
