"""Pipeline schedules: simulator speed at 64 stages x 1,024 micro-batches, bubble formulas reproduced, and
micro-batch tuning of a ViT-B/16-shaped pipeline with and without the measured eager host overhead.

Run: ``python benchmarks/bench_schedule.py`` (or ``nox -s bench``). Writes ``benchmarks/results/schedule.json``
and prints tables. Everything runs in this one process on one core.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from elastic_pipe.schedule import (
    EAGER_HOST_SECONDS_PER_BLOCK,
    LinearCost,
    generate,
    simulate,
    tune_microbatches,
    validate,
)

RESULTS = Path(__file__).resolve().parent / "results" / "schedule.json"
#: Timed runs per speed measurement (the median is reported).
REPEATS = 5
#: The issue's size target: 64 stages x 1,024 micro-batches simulated "well under a second".
BIG_STAGES, BIG_MICROBATCHES = 64, 1024
TARGET_SIMULATE_S = 1.0
#: ViT-B/16 per block at batch 256 on one H200 (REFERENCE.md section 7): forward attention 0.97 + MLP 1.23 ms,
#: forward+backward 3.70 + 3.65 ms; 12 blocks.
VIT_BLOCKS = 12
VIT_FORWARD_PER_SAMPLE = (0.97 + 1.23) * 1e-3 / 256
VIT_BACKWARD_PER_SAMPLE = (3.70 + 3.65 - 0.97 - 1.23) * 1e-3 / 256
#: bf16 activation of one sample (197 x 768) over NVLink at ~286 GB/s, plus the ~45 us per-message floor.
VIT_TRANSFER_PER_SAMPLE = 197 * 768 * 2 / 286e9
VIT_TRANSFER_LATENCY = 45e-6
GLOBAL_BATCH = 512


def _median_time(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    times = []
    for _ in range(REPEATS):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def bench_speed() -> list[dict[str, Any]]:
    rows = []
    for kind, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb1p", 1)):
        ranks = BIG_STAGES // chunks
        schedule = generate(kind, ranks, BIG_MICROBATCHES, chunks)
        rows.append(
            {
                "kind": kind,
                "ranks": ranks,
                "stages": schedule.num_stages,
                "microbatches": BIG_MICROBATCHES,
                "actions": schedule.num_actions,
                "generate_s": _median_time(lambda k=kind, r=ranks, c=chunks: generate(k, r, BIG_MICROBATCHES, c)),
                "validate_s": _median_time(lambda s=schedule: validate(s)),
                "simulate_s": _median_time(lambda s=schedule: simulate(s, 1.0, 2.0, transfer=0.01)),
                # CPU time of this process: the wall time above includes waiting for a shared machine's cores
                "simulate_cpu_s": _median_time(
                    lambda s=schedule: simulate(s, 1.0, 2.0, transfer=0.01), clock=time.process_time
                ),
            }
        )
    return rows


def bench_formulas() -> list[dict[str, Any]]:
    rows = []
    for p, m in ((4, 8), (8, 16), (8, 64), (16, 64)):
        f, b = 1.0, 2.0
        for kind in ("gpipe", "1f1b"):
            sim = simulate(generate(kind, p, m), f, b)
            rows.append({"kind": kind, "p": p, "m": m, "v": 1, "simulated": sim.bubble_fraction,
                         "formula": (p - 1) / (m + p - 1), "formula_text": "(p-1)/(m+p-1)"})  # fmt: skip
        for v in (2, 4):
            sim = simulate(generate("interleaved", p, m, v), f / v, b / v)
            ideal = m * (f + b)
            rows.append({"kind": "interleaved", "p": p, "m": m, "v": v, "simulated": max(sim.idle) / ideal,
                         "formula": (p - 1) / (v * m), "formula_text": "idle/ideal = (p-1)/(v m)"})  # fmt: skip
        zb = simulate(generate("zb1p", p, m), 1.0, 2.0, input_grad=1.0, weight_grad=1.0)
        base = simulate(generate("1f1b", p, m), 1.0, 2.0)
        rows.append({"kind": "zb1p", "p": p, "m": m, "v": 1, "simulated": max(zb.idle) / max(base.idle),
                     "formula": 1 / 3, "formula_text": "idle / 1F1B idle (F=I=W)",
                     "peak_activations": max(zb.peak_activations),
                     "peak_activations_1f1b": max(base.peak_activations)})  # fmt: skip
    return rows


def bench_tuning() -> list[dict[str, Any]]:
    rows = []
    for pipe_len in (8, 4, 2):
        blocks = VIT_BLOCKS / pipe_len
        for host in (0.0, EAGER_HOST_SECONDS_PER_BLOCK):
            cost = LinearCost.uniform(
                pipe_len,
                forward_per_sample=VIT_FORWARD_PER_SAMPLE * blocks,
                backward_per_sample=VIT_BACKWARD_PER_SAMPLE * blocks,
                blocks_per_stage=blocks,
                host_per_block=host,
                transfer_per_sample=VIT_TRANSFER_PER_SAMPLE,
                transfer_latency=VIT_TRANSFER_LATENCY,
            )
            start = time.perf_counter()
            choice = tune_microbatches(cost, GLOBAL_BATCH, pipe_len)
            seconds = time.perf_counter() - start
            rows.append(
                {
                    "pipe_len": pipe_len,
                    "host_per_block_s": host,
                    "chosen_microbatches": choice.microbatches,
                    "chosen_throughput": choice.throughput,
                    "tune_s": seconds,
                    "table": [
                        {"microbatches": r.microbatches, "throughput": r.throughput, "bubble": r.bubble_fraction}
                        for r in choice.table
                    ],
                }
            )
    return rows


def main() -> None:
    """Run the benchmark, write the JSON results and print the tables."""
    speed = bench_speed()
    formulas = bench_formulas()
    tuning = bench_tuning()
    doc = {
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()},
        "target_simulate_s": TARGET_SIMULATE_S,
        "speed": speed,
        "formulas": formulas,
        "tuning": {"global_batch": GLOBAL_BATCH, "model": "ViT-B/16 per-block costs, REFERENCE.md 7", "rows": tuning},
    }
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'kind':12} {'stages':>6} {'mbs':>5} {'actions':>8} {'generate':>9} {'validate':>9} {'simulate':>9} "
          f"{'sim cpu':>8}")  # fmt: skip
    for r in speed:
        print(f"{r['kind']:12} {r['stages']:6d} {r['microbatches']:5d} {r['actions']:8d} {r['generate_s']:8.3f}s "
              f"{r['validate_s']:8.3f}s {r['simulate_s']:8.3f}s {r['simulate_cpu_s']:7.3f}s")  # fmt: skip
    print(f"\n{'kind':12} {'p':>3} {'m':>4} {'v':>2} {'simulated':>10} {'formula':>8}  formula")
    for r in formulas:
        print(f"{r['kind']:12} {r['p']:3d} {r['m']:4d} {r['v']:2d} {r['simulated']:10.4f} {r['formula']:8.4f}  "
              f"{r['formula_text']}")  # fmt: skip
    print(f"\nmicro-batch tuning, ViT-B/16 model, global batch {GLOBAL_BATCH}, samples/s by M")
    for r in tuning:
        cells = " ".join(f"{t['microbatches']}:{t['throughput']:.0f}" for t in r["table"])
        print(f"K={r['pipe_len']} host {r['host_per_block_s'] * 1e3:.0f} ms/block -> M={r['chosen_microbatches']}  "
              f"[{cells}]")  # fmt: skip
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
