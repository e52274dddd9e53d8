"""GroupManager under torchrun: NCCL training groups on GPUs (gloo on CPU), the control group always on gloo.

Run on a machine with N GPUs (or on CPU, where every group uses gloo)::

    torchrun --nproc-per-node 2 examples/groups_torchrun.py

Each rank builds every group for every pipeline length that divides the world size, checks each group's members
with an all-reduce of the rank ids, receives a transition message from rank 0 over the control group, and tears
everything down. It prints one line per rank and exits non-zero if any check fails.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from elastic_pipe.groups import GroupManager
from elastic_pipe.protocol import TransitionMessage, decode, encode

MESSAGE = TransitionMessage(
    epoch=1,
    step=10,
    frozen=2,
    pipe_len=1,
    boundaries=(2, 12),
    microbatches=4,
    max_cost_at_start=1.0,
    changed_ranks=(1,),
)


def main() -> int:
    """Build, check and destroy the groups on this rank."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    on_gpu = torch.cuda.is_available()
    backend = "nccl" if on_gpu else "gloo"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    manager = GroupManager(world, rank, [k for k in range(1, world + 1) if world % k == 0], backend=backend, timeout=60)
    errors = []
    try:
        manager.build()
        for k in manager.pipe_lens:
            plan = manager.plan(k)
            for name, group, members in (
                ("pipeline", manager.pipeline_group(k), plan.pipeline_group_of(rank)),
                ("data-parallel", manager.dp_group(k), plan.dp_group_of(rank)),
            ):
                total = torch.tensor([rank], dtype=torch.int64, device=device)
                dist.all_reduce(total, group=group)
                if int(total.item()) != sum(members):
                    errors.append(f"K={k} {name} group sum {int(total.item())} != {sum(members)}")
        received = decode(manager.broadcast_bytes(encode(MESSAGE) if rank == 0 else None, src=0))
        if received != MESSAGE:
            errors.append(f"message differs: {received}")
        manager.barrier()
    finally:
        manager.destroy()
        dist.destroy_process_group()
    status = "; ".join(errors) if errors else "ok"
    print(
        f"rank {rank}/{world} backend {backend} pipe_lens {list(manager.pipe_lens)} torch {torch.__version__}: {status}"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
