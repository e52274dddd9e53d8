"""Where an elastic run's time goes: the elastic + cache arm of the GPU benchmark under ``torch.profiler``.

Trains the same arm as ``bench_elastic_gpu.py`` (same workload, config and freeze schedule) and profiles the
epochs and transitions named on the command line. For each profiled region rank 0 reports its wall time, the time
the GPU spent in compute kernels and in communication kernels (their sum over the region, from the profiler's
device events), the rest as idle, the operators that took the most host time and the kernels that took the most
device time (an epoch's region includes its evaluation pass)::

    torchrun --nproc-per-node 2 benchmarks/gpu/profile_elastic_gpu.py --epochs-profiled 5,8 --out /tmp/profile

``--tiny`` runs the tiny model on the CPU with gloo (host time only), to check the script. The profiler slows the
host down, so the wall times here are not the benchmark's; the split between busy and idle is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from bench_elastic_gpu import arm_configs, workload  # the benchmark's own workloads and arms
from elastic_pipe.orchestrator import ElasticTrainer
from elastic_pipe.orchestrator.launch import device_for, join_process_group

#: Device kernels whose name starts with one of these are communication, the rest compute.
_COMM = ("nccl", "ncclDevKernel", "ncclKernel")


def _device_us(evt: Any) -> float:
    return float(getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0.0))


def summarise(prof: Any, wall_s: float, top: int) -> dict[str, Any]:
    """Busy and idle device time and the heaviest host operators of one profiled region."""
    table = prof.key_averages()
    compute = comm = 0.0
    for evt in table:
        if evt.device_type != torch.autograd.DeviceType.CUDA:  # kernels only: host ops would count them twice
            continue
        if evt.key.startswith(_COMM):
            comm += _device_us(evt)
        else:
            compute += _device_us(evt)
    kernels = sorted(
        (e for e in table if e.device_type == torch.autograd.DeviceType.CUDA), key=_device_us, reverse=True
    )[:top]
    host = sorted(
        (e for e in table if e.device_type == torch.autograd.DeviceType.CPU),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:top]
    return {
        "wall_s": wall_s,
        "device_compute_s": compute / 1e6,
        "device_comm_s": comm / 1e6,
        "device_idle_s": max(0.0, wall_s - compute / 1e6),
        "host_top": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3} for e in host],
        "device_top": [{"kernel": e.key[:120], "calls": e.count, "ms": _device_us(e) / 1e3} for e in kernels],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="vit", choices=("vit", "gpt"))
    ap.add_argument("--epochs-profiled", default="5,8", help="comma-separated epochs (0-based) to profile")
    ap.add_argument("--transitions-profiled", default="1,5", help="transitions before these epochs to profile")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    epochs_p = {int(e) for e in args.epochs_profiled.split(",") if e}
    trans_p = {int(e) for e in args.transitions_profiled.split(",") if e}

    cuda = torch.cuda.is_available() and not args.tiny
    # the orchestrator's own choice for this process (cuda:LOCAL_RANK with NCCL, else the CPU), made before the
    # workload is built so that the model is built once, where it trains
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    w = workload(args.workload, args.tiny, device, 2)
    config = arm_configs(w, args.tiny, 2, int(os.environ.get("WORLD_SIZE", "1")), 2)["elastic_cache"]
    join_process_group(config)  # joined here, so that the trainer leaves the group to this script
    if device_for(config) != device:
        raise SystemExit(f"the orchestrator would train on {device_for(config)}, not on {device}")
    trainer = ElasticTrainer(config, model=w["build"](), data=w["samples"], quiet=True)
    trainer.start()  # builds the groups, warms them up, splits the data, agrees on the first layout
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    report: dict[str, Any] = {"workload": args.workload, "device": str(device), "regions": {}}

    def region(name: str, on: bool, fn: Any) -> Any:
        if not on:
            return fn()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            out = fn()
            sync()
            wall = time.perf_counter() - start
        report["regions"][name] = summarise(prof, wall, args.top)
        return out

    epochs = config.train.epochs
    with trainer:  # closes the stage, the cache and the trainer's groups
        # ElasticTrainer.fit, one region per epoch (its evaluation included) and per transition
        while trainer.state.epoch < epochs:
            e = trainer.state.epoch
            region(f"epoch{e}", e in epochs_p, trainer.train_epoch)
            if trainer.state.epoch < epochs:
                region(f"transition{trainer.state.epoch}", trainer.state.epoch in trans_p, trainer.transition)
    if dist.get_rank() == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"profile_{args.workload}.json"
        path.write_text(json.dumps(report, indent=1))
        for name, r in report["regions"].items():
            print(
                f"{name}: wall {r['wall_s'] * 1e3:.1f} ms, device compute {r['device_compute_s'] * 1e3:.1f} ms, "
                f"comm {r['device_comm_s'] * 1e3:.1f} ms, idle {r['device_idle_s'] * 1e3:.1f} ms",
                file=sys.stderr,
            )
            for h in r["host_top"][:8]:
                print(f"    {h['self_cpu_ms']:8.2f} ms  {h['calls']:5d}x  {h['op']}", file=sys.stderr)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
