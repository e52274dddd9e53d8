"""Scoring the model on the evaluation split through the trained layout itself: no rank needs the whole model.

Replica ``r`` of ``R`` scores samples ``r, r + R, ...`` in batches of :data:`EVAL_BATCH`. Each batch runs down its
replica's pipeline: stage 0 reads the inputs and runs the frozen prefix and its own sub-layers (or, while the
prefix is released because the activation cache serves it, reads the prefix's outputs kept for the evaluation
split, :meth:`~.prefix.FrozenPrefix.eval_input`, and runs its own sub-layers on them), every stage sends
its output to the next one (point to point, a small header with the shape and dtype first), and the last stage
scores the batch. With several stages per rank (``layout.virtual`` > 1) a rank runs each of its stages in turn,
the batch travelling down the stages (:meth:`~elastic_pipe.types.Layout.placement`) and so round the ranks v times.
One all-reduce sums the loss, the correct answers and the counts over the world.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix
    from elastic_pipe.types import Layout

__all__ = ["EVAL_BATCH", "evaluate", "recv_activation", "send_activation"]

#: Evaluation batch size per replica.
EVAL_BATCH = 256
#: Most dimensions of an activation sent between stages (the header has room for this many sizes).
MAX_NDIM = 8
#: The dtypes an activation may have, by their code in the header.
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.uint8,
)


def send_activation(x: torch.Tensor, dst: int, group: dist.ProcessGroup | None = None) -> None:
    """Send ``x`` to rank ``dst``: a header (dtype code, dimensions, sizes), then the tensor."""
    if x.dim() > MAX_NDIM or x.dtype not in _DTYPES:
        raise ValueError(f"cannot send an activation of dtype {x.dtype} with {x.dim()} dimensions")
    header = torch.zeros(2 + MAX_NDIM, dtype=torch.int64, device=x.device)
    header[0], header[1] = _DTYPES.index(x.dtype), x.dim()
    header[2 : 2 + x.dim()] = torch.tensor(x.shape, dtype=torch.int64)
    dist.send(header, dst, group=group)
    dist.send(x.contiguous(), dst, group=group)


def recv_activation(src: int, device: torch.device, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Receive what :func:`send_activation` sends from rank ``src``."""
    header = torch.zeros(2 + MAX_NDIM, dtype=torch.int64, device=device)
    dist.recv(header, src, group=group)
    code, ndim, *sizes = header.tolist()
    x = torch.empty(sizes[:ndim], dtype=_DTYPES[code], device=device)
    dist.recv(x, src, group=group)
    return x


@torch.no_grad()
def evaluate(ctx: RunContext, layout: Layout, prefix: FrozenPrefix) -> tuple[float, float | None]:
    """Loss and accuracy of the model on the evaluation split, pipelined through ``layout`` (a collective);
    stage 0 starts from ``prefix``'s kept evaluation outputs while its weights are released.

    Returns:
        The mean loss and the accuracy (``None`` when the output is not per-sample class scores).
    """
    plan = ctx.plan(layout)
    position, replica = int(plan.stage_of(ctx.rank)), int(plan.replica_of(ctx.rank))
    placement = layout.placement()
    last = position == layout.pipe_len - 1  # the last position holds the last stage (loop placement)
    pipeline = plan.pipeline_groups[replica]
    group = ctx.groups.pipeline_group(layout.pipe_len)
    # (stage, its rank's position, the sub-layers it runs, the next stage's position or None after the last)
    ranks, n = placement.ranks, placement.num_stages
    kept = position == 0 and prefix.released > 0  # the prefix's outputs are kept, its weights released
    runs = [
        (s, lo if s > 0 or kept else 0, hi, ranks[s + 1] if s + 1 < n else None)  # stage 0 runs the prefix too,
        for s, (lo, hi) in zip(placement.stages_of(position), placement.ranges_of(position), strict=True)
    ]  # unless it is released
    was = ctx.model.training
    ctx.model.eval()
    data = ctx.eval_set
    mine = torch.arange(replica, len(data), layout.replicas)
    chunks = [chunk.tolist() for chunk in torch.split(mine, EVAL_BATCH)]
    totals = torch.zeros(4, dtype=torch.float64, device=ctx.device)  # loss sum, correct, count, not-classified
    sublayers = ctx.sublayers
    for batch in data.batches(chunks, inputs=position == 0 and not kept, labels=last, device=ctx.device):
        x: torch.Tensor | None = None
        for s, start, hi, after in runs:
            if s == 0 and kept:
                x, at = prefix.eval_input(batch.positions)
                assert at == layout.frozen == start
            elif s == 0:
                x = batch.inputs
            elif ranks[s - 1] != position:  # from another rank (with one rank, the stages pass it along here)
                x = recv_activation(pipeline[ranks[s - 1]], ctx.device, group)
            assert x is not None  # stage 0 reads inputs
            with ctx.autocast():
                for j in range(start, hi):
                    x = sublayers[j](x)
            if after is not None and after != position:
                send_activation(x, pipeline[after], group)
        if not last:
            continue
        assert x is not None  # the last stage ran here
        y = batch.labels
        assert y is not None  # the last stage reads labels
        rows = len(batch.positions)
        totals[0] += float(ctx.parts.loss(x, y)) * rows
        if x.dim() == 2:
            totals[1] += float((x.argmax(-1) == y).sum())
        else:
            totals[3] += 1
        totals[2] += rows
    dist.all_reduce(totals)
    ctx.restore_modes(layout, was)
    count = float(totals[2])
    return float(totals[0]) / count, (float(totals[1]) / count if float(totals[3]) == 0 else None)
