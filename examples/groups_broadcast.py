"""Four gloo processes agree on a transition: rank 0 broadcasts it, every rank switches to the new groups.

Every group for every reachable pipeline length is created once at start-up (``GroupManager.build``); the
transition message travels over the static gloo control group as bytes; each rank then uses the cached groups of
the new pipeline length. Run: python examples/groups_broadcast.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from elastic_pipe.groups import GroupManager, plan_pipetransformer, plan_spmd
from elastic_pipe.protocol import TransitionMessage, decode, encode
from elastic_pipe.testing import RankContext, run_distributed

WORLD_SIZE = 4
PIPE_LENS = (4, 2, 1)


def _rank(ctx: RankContext) -> str:
    manager = GroupManager(ctx.world_size, ctx.rank, PIPE_LENS, backend="gloo", timeout=30.0)
    manager.build()
    try:
        message = None
        if ctx.rank == 0:  # rank 0 decides: 4 layers frozen, pipeline halved from 4 to 2 stages
            message = encode(
                TransitionMessage(
                    epoch=1,
                    step=100,
                    frozen=4,
                    pipe_len=2,
                    boundaries=(4, 8, 12),
                    microbatches=8,
                    max_cost_at_start=3.0,
                    changed_ranks=(1, 2, 3),
                )
            )
        transition = decode(manager.broadcast_bytes(message, src=0))
        plan = manager.plan(transition.pipe_len)
        # Gradient all-reduce of the new layout: same stage, every replica.
        grad = torch.tensor([float(ctx.rank)])
        dist.all_reduce(grad, group=manager.dp_group(transition.pipe_len))
        return (
            f"rank {ctx.rank}: pipe_len {transition.pipe_len} -> replica {plan.replica_of(ctx.rank)}, "
            f"stage {plan.stage_of(ctx.rank)}, pipeline {plan.pipeline_group_of(ctx.rank)}, "
            f"data-parallel {plan.dp_group_of(ctx.rank)}, sum of ranks over it {grad.item():g}"
        )
    finally:
        manager.destroy()


def main() -> None:
    """Print the pure plans, then run the transition on four processes."""
    print("SPMD, W=8, K=4 pipeline groups:", plan_spmd(8, 4).pipeline_groups)
    published = plan_pipetransformer(16, 8, 4)
    print("PipeTransformer, W=16, K0=8, K=4: active", published.active_ranks, "new", published.new_ranks)
    for line in run_distributed(_rank, WORLD_SIZE, timeout=60.0):
        print(line)


if __name__ == "__main__":
    main()
