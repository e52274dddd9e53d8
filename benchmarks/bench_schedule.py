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
#: Measured on 2 H200s (torch 2.11, NCCL, bf16 weights, eager), global batch 512, samples/s by micro-batch count:
#: ``torchrun --nproc-per-node 2 examples/schedule_torchrun.py --check --time --kind K --microbatches 2 4 8 16 32``
MEASURED_H200_K2: dict[str, dict[int, float]] = {
    "1f1b": {2: 3873.2, 4: 4219.9, 8: 4159.1, 16: 2517.7, 32: 1414.5},
    "zb1p": {2: 4572.7, 4: 4651.1, 8: 2665.9, 16: 1445.6, 32: 686.8},
    "gpipe": {2: 3865.0, 4: 4439.6, 8: 4597.1, 16: 2921.2, 32: 1360.5},
}


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


def bench_against_h200() -> list[dict[str, Any]]:
    """Model predictions (added vs overlapped host time) next to the 2-GPU measurement, 1F1B and GPipe, K = 2."""
    rows = []
    blocks = VIT_BLOCKS / 2
    for kind in ("1f1b", "gpipe"):
        measured = MEASURED_H200_K2[kind]
        row: dict[str, Any] = {"kind": kind, "measured": {str(m): v for m, v in measured.items()}}
        for overlap in (False, True):
            cost = LinearCost.uniform(
                2,
                forward_per_sample=VIT_FORWARD_PER_SAMPLE * blocks,
                backward_per_sample=VIT_BACKWARD_PER_SAMPLE * blocks,
                blocks_per_stage=blocks,
                transfer_per_sample=VIT_TRANSFER_PER_SAMPLE,
                transfer_latency=VIT_TRANSFER_LATENCY,
                overlap=overlap,
            )
            choice = tune_microbatches(cost, GLOBAL_BATCH, 2, kind=kind, candidates=measured)
            row["overlapped" if overlap else "added"] = {str(r.microbatches): r.throughput for r in choice.table}
            row[f"chosen_{'overlapped' if overlap else 'added'}"] = choice.microbatches
        row["best_measured"] = max(measured, key=lambda m: measured[m])
        rows.append(row)
    return rows


def main() -> None:
    """Run the benchmark, write the JSON results and print the tables."""
    speed = bench_speed()
    formulas = bench_formulas()
    tuning = bench_tuning()
    h200 = bench_against_h200()
    doc = {
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()},
        "target_simulate_s": TARGET_SIMULATE_S,
        "speed": speed,
        "formulas": formulas,
        "tuning": {"global_batch": GLOBAL_BATCH, "model": "ViT-B/16 per-block costs, REFERENCE.md 7", "rows": tuning},
        "model_vs_h200": h200,
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
    print(f"\nK=2, global batch {GLOBAL_BATCH}: samples/s by M, measured on 2 H200s vs the model (host 1 ms/block)")
    for r in h200:
        for source in ("measured", "added", "overlapped"):
            cells = " ".join(f"{m}:{v:.0f}" for m, v in r[source].items())
            print(f"{r['kind']:6} {source:10} [{cells}]")
        print(f"{r['kind']:6} best: measured M={r['best_measured']}, added M={r['chosen_added']}, "
              f"overlapped M={r['chosen_overlapped']}")  # fmt: skip
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
