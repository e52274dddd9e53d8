"""Planner benchmark: how long a plan takes (8 to 1,024 GPUs), what it predicts, and how well it is calibrated.

Writes ``benchmarks/results/planner.json`` and prints four tables: planning time and predicted speedups for
ViT-B/16 and GPT-2 XL on 8, 16, 64 and 1,024 GPUs (H200-like defaults), the calibration against the H200
measurements kept in ``benchmarks/planner_calibration.py``, the orchestrator's measured epochs of the GPU benchmark
against their predictions (the run the per-step host terms were fitted on, ``results/gpu_2xh200_vit_session1.json``,
and two later runs they were not, ``results/gpu_2xh200_vit_session2.json`` and ``results/gpu_2xh200_vit.json``;
each when present), and a CPU run predicted from its profile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from planner_calibration import cpu_calibration, gpu_benchmark_calibration, h200_calibration, load_gpu_benchmark

from elastic_pipe.planner import ClusterSpec, GpuSpec, JobSpec, parse_bytes, plan_model
from elastic_pipe.planner.calibration import CalibrationRow, format_rows

RESULTS = Path(__file__).resolve().parent / "results" / "planner.json"
#: The GPU benchmark's measured runs (``benchmarks/gpu/bench_elastic_gpu.py`` on 2x H200): the one the planner's
#: per-step host terms were fitted on, and later ones (new step loops, new sessions) that check them out of sample.
GPU_RUNS = {
    "fitted": Path(__file__).resolve().parent / "results" / "gpu_2xh200_vit_session1.json",
    "out_of_sample": Path(__file__).resolve().parent / "results" / "gpu_2xh200_vit_session2.json",
    "latest": Path(__file__).resolve().parent / "results" / "gpu_2xh200_vit.json",
}
#: ImageNet-1k training samples: the epoch length of the ViT cases.
IMAGENET = 1_281_167
#: Sequences per epoch of the GPT cases (an assumption: a 1B-token slice at 1,024 tokens).
GPT_SEQUENCES = 1_000_000

#: (model, GPUs, per-GPU memory, global batch, initial pipeline length or None, samples per epoch)
CASES: list[tuple[str, int, str, int, int | None, int]] = [
    ("vit-b16", 8, "16GiB", 512, None, IMAGENET),
    ("vit-b16", 16, "16GiB", 1024, None, IMAGENET),
    ("vit-b16", 16, "16GiB", 1024, 8, IMAGENET),
    ("vit-b16", 64, "16GiB", 4096, 8, IMAGENET),
    ("vit-b16", 1024, "141GB", 65536, None, IMAGENET),
    ("gpt2-xl", 8, "80GB", 64, None, GPT_SEQUENCES),
    ("gpt2-xl", 16, "80GB", 128, None, GPT_SEQUENCES),
    ("gpt2-xl", 64, "80GB", 512, None, GPT_SEQUENCES),
    ("gpt2-xl", 64, "80GB", 512, 16, GPT_SEQUENCES),
    ("gpt2-xl", 1024, "80GB", 8192, None, GPT_SEQUENCES),
    ("gpt2-xl", 1024, "80GB", 8192, 64, GPT_SEQUENCES),
]


def run_case(case: tuple[str, int, str, int, int | None, int]) -> dict[str, Any]:
    """Plan one case and time the planner."""
    model, gpus, memory, batch, pipe_len, samples = case
    cluster = ClusterSpec(gpus, 8, GpuSpec(memory=parse_bytes(memory)))
    job = JobSpec(batch, 10, -(-samples // batch), pipe_len=pipe_len, dataset_size=samples)
    start, cpu_start = time.perf_counter(), time.process_time()
    plan = plan_model(model, cluster, job)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "model": model,
        "gpus": gpus,
        "gpu_memory": memory,
        "global_batch": batch,
        "initial_pipe_len": pipe_len,
        "plan_seconds": seconds,
        "plan_cpu_seconds": cpu_seconds,  # robust to other work sharing the machine
        "static_layout": f"{plan.static[0].pipe_len}x{plan.static[0].replicas}",
        "pipe_lens": [e.pipe_len for e in plan.epochs],
        "frozen": [e.frozen for e in plan.epochs],
        "throughput": [e.throughput for e in plan.epochs],
        "static_throughput": plan.static[0].throughput,
        "speedup": plan.speedup,
        "speedup_over_freeze_only": plan.speedup_over_freeze_only,
        "transitions": plan.transitions,
        "hours": plan.seconds / 3600,
        "static_hours": plan.static_seconds / 3600,
    }


def gpu_rows(path: Path) -> list[CalibrationRow]:
    """A GPU benchmark run's steady epochs, measured and predicted (none without the results file)."""
    if not path.exists():
        return []
    run = load_gpu_benchmark(path)
    return gpu_benchmark_calibration(
        run["arms"], gpus=run["gpus"], global_batch=run["global_batch"], steps_per_epoch=run["steps_per_epoch"]
    )


def main() -> None:
    """Run every case and the calibrations; write the results file and print tables."""
    cases = [run_case(case) for case in CASES]
    gpu_tables = {kind: gpu_rows(path) for kind, path in GPU_RUNS.items()}
    gpu = {
        kind: [
            {"name": r.name, "unit": r.unit, "measured": r.measured, "predicted": r.predicted, "error": r.error}
            for r in rows
        ]
        for kind, rows in gpu_tables.items()
    }
    h200 = [
        {"name": r.name, "unit": r.unit, "measured": r.measured, "predicted": r.predicted, "error": r.error}
        for r in h200_calibration()
    ]
    cpu = [
        {"name": r.name, "measured_ms": r.measured, "predicted_ms": r.predicted, "error": r.error}
        for r in cpu_calibration()
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"cases": cases, "h200_calibration": h200, "gpu_benchmark_calibration": gpu, "cpu_calibration": cpu},
            indent=2,
        )
    )
    print(f"{'model':>8} {'GPUs':>5} {'mem':>6} {'batch':>6} {'K0':>4} {'plan s':>7} {'static':>7} "
          f"{'cpu s':>6} {'K per epoch':>32} {'speedup':>8} {'vs freeze-only':>15}")  # fmt: skip
    for c in cases:
        k0 = "auto" if c["initial_pipe_len"] is None else str(c["initial_pipe_len"])
        lengths = ",".join(str(k) for k in c["pipe_lens"])
        print(
            f"{c['model']:>8} {c['gpus']:>5} {c['gpu_memory']:>6} {c['global_batch']:>6} {k0:>4} "
            f"{c['plan_seconds']:>7.2f} {c['static_layout']:>7} {c['plan_cpu_seconds']:>6.2f} {lengths:>32} "
            f"{c['speedup']:>7.2f}x "
            f"{c['speedup_over_freeze_only']:>14.2f}x"
        )
    print()
    for row in h200:
        print(f"{row['name']:<55} {row['measured']:>10.4g} {row['predicted']:>10.4g} {row['error']:>+8.1%}")
    for kind, rows in gpu_tables.items():
        if rows:
            print(f"\nGPU benchmark ({GPU_RUNS[kind].name}, {kind}), first epoch of every arm left out as warm-up:")
            print(format_rows(rows))
    print()
    for row in cpu:
        print(f"{row['name']:<55} {row['measured_ms']:>10.4g} {row['predicted_ms']:>10.4g} {row['error']:>+8.1%}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
