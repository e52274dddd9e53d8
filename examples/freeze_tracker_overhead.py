"""Measure what the freeze primitives cost inside a training step of a ViT-B/16-sized encoder.

Times, each the median of 30 steps per variant (alternated, after 5 warm-up steps): a plain training step
(forward, backward, AdamW step); the same step plus ``GradNormTracker.accumulate()`` over all 12 blocks; one
``local_stats()`` call (an interval's end); one ``freeze_modules()`` call that takes 4 blocks out of the optimizer.
Prints a table and, with ``--json PATH``, writes the numbers. Without CUDA it runs a small configuration on the CPU.

Run:  python examples/freeze_tracker_overhead.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from elastic_pipe.freeze import GradNormTracker, freeze_modules

# ViT-B/16: 12 blocks, width 768, 12 heads, MLP 3072, 197 tokens per image
VIT_B = {"layers": 12, "width": 768, "heads": 12, "mlp": 3072, "tokens": 197, "batch": 64}
SMALL = {"layers": 4, "width": 64, "heads": 4, "mlp": 128, "tokens": 16, "batch": 8}
WARMUP, TIMED, FROZEN = 5, 30, 4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the measurements to this file")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = VIT_B if device.type == "cuda" else SMALL
    torch.manual_seed(0)
    blocks = nn.ModuleList(
        nn.TransformerEncoderLayer(
            cfg["width"], cfg["heads"], cfg["mlp"], dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        for _ in range(cfg["layers"])
    ).to(device)
    optimizer = torch.optim.AdamW(blocks.parameters(), lr=1e-4)
    tracker = GradNormTracker(dict(enumerate(blocks)))
    x = torch.randn(cfg["batch"], cfg["tokens"], cfg["width"], device=device)

    def step(track: bool) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            h = x
            for block in blocks:
                h = block(h)
            loss = h.float().square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if track:
            tracker.accumulate()
        optimizer.step()

    for _ in range(WARMUP):
        step(True)
    # alternate the two variants so that drifting clocks or a busy neighbour hit both alike
    plain_samples, tracked_samples = [], []
    for _ in range(TIMED):
        plain_samples.append(_median_seconds(lambda: step(False), device, 1))
        tracked_samples.append(_median_seconds(lambda: step(True), device, 1))
    plain, tracked = statistics.median(plain_samples), statistics.median(tracked_samples)

    def interval_end() -> None:
        tracker.local_stats(cfg["layers"])

    stats_s = _median_seconds(interval_end, device, 5)
    _sync(device)
    start = time.perf_counter()
    removed = freeze_modules(list(blocks[:FROZEN]), optimizer)
    _sync(device)
    freeze_s = time.perf_counter() - start
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "config": cfg,
        "params": sum(p.numel() for p in blocks.parameters()),
        "step_ms": plain * 1e3,
        "step_with_accumulate_ms": tracked * 1e3,
        "accumulate_overhead_ms": (tracked - plain) * 1e3,
        "local_stats_ms": stats_s * 1e3,
        "freeze_modules_ms": freeze_s * 1e3,
        "freeze_removed_tensors": removed,
    }
    for key, value in result.items():
        print(f"{key:>26}  {value:.3f}" if isinstance(value, float) else f"{key:>26}  {value}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
