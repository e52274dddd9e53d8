"""Every schedule that runs in training, timed on CPU: one model, one batch, one fixed layout per schedule.

A small ViT (6 blocks of width 64 on the 8x8 digits, float32) trains in 4 gloo processes with the same global batch
(64) and micro-batch count (8), the freeze policy ``never`` and compression ``none``, so the layout never changes:

* ``gpipe``, ``1f1b``, ``zb1p``: 4 stages, one per rank (``pipe_len = 4``, ``virtual = 1``);
* ``interleaved`` and ``gpipe`` (looped): 8 stages, two per rank (``pipe_len = 4``, ``virtual = 2``).

Each setting trains :data:`EPOCHS` epochs of :data:`STEPS` steps in the same 4 processes, one setting after the
other; an epoch's step time is its time without its first step (which carries the layout's warm-up) over the
steps left, and the first epoch is left out as warm-up. The table gives the median over the other epochs, and
beside it the planner's prediction for the same layout (``elastic-pipe plan --config``'s: the stages the layout
rule cut, the FLOPs of each sub-layer, the simulated schedule), whose bubble share is what the schedules change.

The 4 processes share the machine's cores (2 on the machine that measured ``benchmarks/results``), so the times
compare the schedules with each other, not with a GPU.

Run: ``python benchmarks/bench_schedule_training.py [--out PATH]`` (about a minute). Writes
``benchmarks/results/schedule_training_cpu.json`` stamped with the commit (``_report.provenance``) and prints the
Markdown table of docs/schedule.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from _report import emit, provenance  # benchmarks/gpu: where a result was measured
from elastic_pipe.testing import RankContext, run_distributed

RESULTS = Path(__file__).resolve().parent / "results" / "schedule_training_cpu.json"
#: Processes, and ranks per pipeline (one replica).
WORLD = 4
#: (schedule, stages per rank) timed, in the table's order.
SETTINGS = (("gpipe", 1), ("1f1b", 1), ("zb1p", 1), ("interleaved", 2), ("gpipe", 2))
#: ``[model]``: 14 sub-layers (embedding, 6 x attention + MLP, head), enough for 8 stages.
MODEL: dict[str, Any] = {
    "name": "vit",
    "options": {"preset": "vit-tiny", "depth": 6, "dim": 64, "heads": 2, "mlp_dim": 128},
}
GLOBAL_BATCH = 64
MICROBATCHES = 8
#: Steps per epoch and epochs per setting; the first epoch is warm-up.
STEPS = 8
EPOCHS = 6
#: Training samples of an epoch, and the 1/5 more that ``[data] eval_fraction = 0.2`` holds out.
SAMPLES = STEPS * GLOBAL_BATCH * 5 // 4


def tables(schedule: str, virtual: int) -> dict[str, Any]:
    """The run's config tables for one setting."""
    return {
        "model": MODEL,
        "train": {"dtype": "float32", "epochs": EPOCHS, "global_batch": GLOBAL_BATCH, "optimizer": "sgd", "lr": 0.01},
        "freeze": {"policy": "never"},
        "pipeline": {
            "pipe_len": WORLD,
            "virtual": virtual,
            "schedule": schedule,
            "microbatches": MICROBATCHES,
            "solver": "optimal",
            "compression": "none",
            "cache": "off",
        },
        "launch": {"nproc_per_node": WORLD},
        "log": {"progress": False},
    }


def _samples() -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])


def _train(ctx: RankContext, settings: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
    """Every setting in turn on this rank: per epoch, its steps, seconds and first step's seconds."""
    from elastic_pipe.orchestrator import config_from_tables, run_rank

    out = []
    for schedule, virtual in settings:
        t0 = time.perf_counter()
        result = run_rank(config_from_tables(tables(schedule, virtual)), samples=_samples(), quiet=True).to_dict()
        epochs = [
            {k: e[k] for k in ("steps", "seconds", "first_step_s", "pipe_len", "replicas", "microbatches")}
            for e in result["epochs"]
        ]
        out.append({"epochs": epochs, "wall_seconds": time.perf_counter() - t0})
    return out


def predicted(schedule: str, virtual: int) -> dict[str, Any]:
    """The planner's step for the setting's layout, as ``elastic-pipe plan --config`` prints it (H200 defaults)."""
    from elastic_pipe.cli.plan import predict_config
    from elastic_pipe.orchestrator import config_from_tables

    first, *rest = predict_config(config_from_tables(tables(schedule, virtual)))
    assert all(r["boundaries"] == first["boundaries"] for r in rest), "policy never keeps the layout"
    return first


def step_seconds(epoch: dict[str, Any]) -> float:
    """An epoch's time per step, its first step left out."""
    return float((epoch["seconds"] - epoch["first_step_s"]) / (epoch["steps"] - 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the stamped JSON goes")
    opts = ap.parse_args(argv)
    t0 = time.perf_counter()
    (runs, *_) = run_distributed(_train, WORLD, SETTINGS, timeout=600)
    rows = []
    for (schedule, virtual), run in zip(SETTINGS, runs, strict=True):
        steps = [step_seconds(e) for e in run["epochs"][1:]]
        plan = predicted(schedule, virtual)
        rows.append(
            {
                "schedule": schedule,
                "virtual": virtual,
                "pipe_len": run["epochs"][0]["pipe_len"],
                "replicas": run["epochs"][0]["replicas"],
                "microbatches": run["epochs"][0]["microbatches"],
                "step_ms": 1e3 * statistics.median(steps),
                "step_ms_by_epoch": [1e3 * s for s in steps],
                "predicted_bubble": plan["predicted"]["bubble_fraction"],
                "predicted_step_ms": 1e3 * plan["predicted"]["step_time"],
                "boundaries": plan["boundaries"],
            }
        )
    base = rows[0]["step_ms"]
    for row in rows:
        row["relative_to_gpipe"] = row["step_ms"] / base
    report = {
        "benchmark": "schedule_training_cpu",
        "world_size": WORLD,
        "model": MODEL,
        "global_batch": GLOBAL_BATCH,
        "microbatches": MICROBATCHES,
        "steps_per_epoch": STEPS,
        "epochs": EPOCHS,
        "rows": rows,
        "wall_seconds": time.perf_counter() - t0,
        **provenance(),
    }
    emit(report, opts.out)
    print("\n| schedule | v | K | step ms (median) | vs gpipe | predicted bubble |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['schedule']} | {r['virtual']} | {r['pipe_len']} | {r['step_ms']:.1f} | "
            f"{r['relative_to_gpipe']:.2f} | {r['predicted_bubble']:.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
