"""Run elastic_pipe schedules for real on torch.distributed.pipelining, one process per pipeline rank.

CPU (gloo), checking that each schedule's gradients equal the unpipelined model's::

    torchrun --nproc-per-node 2 examples/schedule_torchrun.py --check

GPUs (NCCL), timing a ViT-B/16-shaped pipeline (12 transformer blocks split evenly over the ranks) for several
micro-batch counts, to compare with ``tune_microbatches``::

    torchrun --nproc-per-node 2 examples/schedule_torchrun.py --time --kind 1f1b --microbatches 2 4 8 16 32

Rank 0 prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from elastic_pipe.schedule import generate, torch_schedule, validate

#: ViT-B/16 shape: 197 tokens of width 768, 12 heads, MLP 4 x 768, 12 blocks.
TOKENS, WIDTH, HEADS, BLOCKS = 197, 768, 12, 12
WARMUP_STEPS, TIMED_STEPS = 3, 10


def _blocks(count: int, width: int, device: torch.device, dtype: torch.dtype) -> nn.Sequential:
    layers = [
        nn.TransformerEncoderLayer(width, HEADS, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        for _ in range(count)
    ]
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def check(rank: int, world: int, device: torch.device) -> dict[str, float]:
    """Every generator: pipelined gradients vs the unpipelined model (float64, tiny MLP)."""
    errors = {}
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=gen, dtype=torch.float64).to(device)
    y = torch.randn(48, 6, generator=gen, dtype=torch.float64).to(device)
    for kind, mbs, chunks in (("gpipe", 4, 1), ("1f1b", 4, 1), ("zb1p", 4, 1), ("interleaved", 2 * world, 2)):
        schedule = generate(kind, world, mbs, chunks)
        validate(schedule)
        torch.manual_seed(0)
        layers = (nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(schedule.num_stages))
        model = nn.Sequential(*layers).double().to(device)
        reference = copy.deepcopy(model)
        nn.functional.mse_loss(reference(x), y).backward()
        mine = schedule.stages_of(rank)
        stages = [PipelineStage(model[s], s, schedule.num_stages, device) for s in mine]
        runner = torch_schedule(schedule, rank, stages, nn.functional.mse_loss)
        runner.step(*((x,) if 0 in mine else ()), target=y if schedule.num_stages - 1 in mine else None)
        worst = 0.0
        for s in mine:
            for got, want in zip(model[s].parameters(), reference[s].parameters(), strict=True):
                assert got.grad is not None and want.grad is not None
                worst = max(worst, (got.grad - want.grad).abs().max().item())
        errors[f"{kind}/v{chunks}"] = worst
    return errors


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def time_steps(
    rank: int, world: int, device: torch.device, *, kind: str, counts: list[int], batch: int, width: int = WIDTH
) -> dict[str, float]:
    """Samples per second of a ViT-B/16-shaped pipeline (bf16) for each micro-batch count."""
    torch.manual_seed(0)
    stage_module = _blocks(BLOCKS // world, width, device, torch.bfloat16)
    x = torch.randn(batch, TOKENS, width, device=device, dtype=torch.bfloat16)
    y = torch.randn(batch, TOKENS, width, device=device, dtype=torch.bfloat16)
    out = {}
    for mbs in counts:
        schedule = generate(kind, world, mbs)
        stage = PipelineStage(stage_module, rank, world, device)
        runner = torch_schedule(schedule, rank, [stage], nn.functional.mse_loss)
        inputs = (x,) if rank == 0 else ()
        target = y if rank == world - 1 else None
        for _ in range(WARMUP_STEPS):
            runner.step(*inputs, target=target)
        _sync(device)
        start = time.perf_counter()
        for _ in range(TIMED_STEPS):
            runner.step(*inputs, target=target)
            stage_module.zero_grad(set_to_none=True)
        _sync(device)
        out[str(mbs)] = batch * TIMED_STEPS / (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="gradient equality for every generator")
    parser.add_argument("--time", action="store_true", help="time a ViT-B/16-shaped pipeline")
    parser.add_argument("--kind", default="1f1b")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--width", type=int, default=WIDTH, help="model width (768 = ViT-B; small for a CPU try)")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    try:
        report: dict[str, object] = {"torch": torch.__version__, "world": world, "device": str(device)}
        if args.check:
            errors = check(rank, world, device)
            gathered: list[dict[str, float] | None] = [None] * world
            dist.all_gather_object(gathered, errors)
            report["max_gradient_error"] = {k: max(g[k] for g in gathered if g) for k in errors}
        if args.time:
            report["samples_per_s"] = time_steps(
                rank, world, device, kind=args.kind, counts=args.microbatches, batch=args.batch, width=args.width
            )
            report["kind"], report["batch"] = args.kind, args.batch
        if rank == 0:
            print(json.dumps(report, indent=1))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
