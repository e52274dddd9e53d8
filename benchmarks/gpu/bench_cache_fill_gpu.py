"""The shared activation-cache fill alone: how long one transition's fill takes, and what changes it.

Two replicas' stage-0 ranks fill the ViT-B/16 benchmark's cache together (``prefix.shared.fill_shared``), for the
first transition of its freeze schedule (nothing cached: the embedding and 4 blocks run from the inputs) and for a
late one (one more block on top of the carried entries). Each case is run with the all-gathers overlapped with
the next round's compute and without, at several chunk sizes, and set beside its forward compute alone (the same
sub-layers on the same chunks, no cache, no communication), which is the floor::

    torchrun --nproc-per-node 2 benchmarks/gpu/bench_cache_fill_gpu.py --out /tmp/fill
    torchrun --nproc-per-node 2 benchmarks/gpu/bench_cache_fill_gpu.py --tiny --out /tmp/fill   # CPU check

Rank 0 prints the median of ``--repeats`` runs per case and writes ``<out>/cache_fill_<device>.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench_elastic_gpu import workload  # the benchmark's own workload: same model, data and batch
from elastic_pipe.cache import ActivationCache
from elastic_pipe.orchestrator.data import split_samples
from elastic_pipe.orchestrator.prefix.carry import CacheJob, FillPeers
from elastic_pipe.orchestrator.prefix.shared import fill_shared


def cases(unit_ends: tuple[int, ...]) -> list[tuple[str, int, int]]:
    """(name, old boundary, new boundary) in sub-layers: the schedule's first transition (4 units frozen from
    nothing: the embedding and 4 blocks run from the inputs) and a late one (one more unit on carried entries)."""
    n = len(unit_ends)
    first = min(3, n - 2)
    return [
        (f"first: 0 -> {first + 1} units", 0, unit_ends[first]),
        (f"late: {n - 2} -> {n - 1} units", unit_ends[n - 3], unit_ends[n - 2]),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", default="256,512", help="samples per forward (the elastic run uses 256)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="tiny model on the CPU with gloo: checks the script")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.tiny
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    w = workload("vit", args.tiny, device, 2)
    train, _ = split_samples(w["samples"], 0.05, 0, torch.float32)
    model = w["build"]().to(device).eval()
    layers = list(model.children())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    peers = FillPeers(dist.group.WORLD, rank, world)
    dist.all_reduce(torch.zeros(1, device=device))  # the communicator exists before anything is timed

    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        with torch.no_grad(), autocast:
            for j in range(lo, hi):
                x = layers[j](x)
        return x

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()

    def timed(fn: Any, setup: Any = None) -> float:
        """Median seconds of ``fn`` over the repeats; ``setup`` runs untimed before each."""
        times = []
        for _ in range(args.repeats + 1):  # the first run warms up (allocations, kernels): dropped
            if setup is not None:
                setup()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def measure(old: int, new: int, chunk: int) -> dict[str, float]:
        cache = ActivationCache(int(train.sample_ids.max()) + 1, device_budget=40 * 2**30, device=device)
        # the floor: this rank's share of the chunks through the newly frozen sub-layers, nothing else
        mine = [train.inputs[lo : lo + chunk].to(device) for lo in range(rank * chunk, len(train), world * chunk)]
        if old:
            mine = [run(x, 0, old) for x in mine]
        row = {"compute_floor_s": timed(lambda: [run(x, old, new) for x in mine])}

        def as_the_transition_finds_it() -> None:
            for b in cache.boundaries():  # entries at ``old`` only (none when ``old`` is 0)
                cache.drop(b)
            if old:
                fill_shared(CacheJob(cache, train, 0, old, chunk, device, run), peers)

        for overlap in (True, False):
            fill = functools.partial(
                fill_shared, CacheJob(cache, train, old, new, chunk, device, run), peers, overlap=overlap
            )
            row["overlapped_s" if overlap else "sequential_s"] = timed(fill, setup=as_the_transition_finds_it)
        cache.close()
        return row

    results: dict[str, Any] = {}
    for name, old, new in cases(tuple(model.unit_ends)):
        for chunk in (int(c) for c in args.chunks.split(",")):
            row = measure(old, new, chunk)
            results[f"{name}, chunk {chunk}"] = row
            if rank == 0:
                ms = {k: f"{v * 1e3:7.1f} ms" for k, v in row.items()}
                print(
                    f"{name:24s} chunk {chunk:4d}: overlapped {ms['overlapped_s']}, sequential {ms['sequential_s']}, "
                    f"compute floor {ms['compute_floor_s']}",
                    flush=True,
                )
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tag = "tiny_cpu" if not cuda else torch.cuda.get_device_name(device).replace(" ", "_").lower()
        report = {"device": tag, "gpus": world, "samples": len(train), "cases": results}
        (out / f"cache_fill_{tag}.json").write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
