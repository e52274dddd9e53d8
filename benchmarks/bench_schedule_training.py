"""Every schedule that runs in training, timed on CPU: one model, one batch, one fixed layout per schedule.

A small ViT (6 blocks of width 64 on the 8x8 digits, float32) trains in 4 gloo processes with the same global batch
(64) and micro-batch count (8), the freeze policy ``never`` and compression ``none``, so the layout never changes:

* ``gpipe``, ``1f1b``, ``zb1p``: 4 stages, one per rank (``pipe_len = 4``, ``virtual = 1``);
* ``interleaved`` and ``gpipe`` (looped): 8 stages, two per rank (``pipe_len = 4``, ``virtual = 2``).

The same 4 processes train every setting in turn, :data:`EPOCHS` epochs of :data:`STEPS` steps each, and go
round the settings :data:`ROUNDS` times (so that a burst of load from elsewhere falls on every setting alike). An
epoch's step time is its time without its first step (which carries the layout's warm-up) over the steps left;
each run's first epoch is left out as warm-up. The table gives the median and the fastest of the other epochs,
and beside them the planner's prediction for the same layout (``elastic-pipe plan --config``'s: the stages the layout
rule cut, the FLOPs of each sub-layer, the simulated schedule), whose bubble share is what the schedules change.

The 4 processes share the machine's cores (2 on the machine that measured ``benchmarks/results``), so the times
compare the schedules with each other, not with a GPU.

Run: ``python benchmarks/bench_schedule_training.py [--out PATH]`` (about a minute). Writes
``benchmarks/results/schedule_training_cpu.json`` stamped with the commit (``_report.provenance``) and prints the
Markdown table of docs/schedule.md.
"""

from __future__ import annotations

import argparse
import os
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
#: Steps per epoch, epochs per run of a setting (the first is warm-up) and rounds over the settings.
STEPS = 10
EPOCHS = 3
ROUNDS = 3
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


def _train(ctx: RankContext, settings: tuple[tuple[str, int], ...], rounds: int) -> list[list[dict[str, Any]]]:
    """Every setting in turn on this rank, ``rounds`` times: per round and setting, the run's epochs (steps,
    seconds, first step's seconds, layout)."""
    from elastic_pipe.orchestrator import config_from_tables, run_rank

    out = []
    for _ in range(rounds):
        runs = []
        for schedule, virtual in settings:
            result = run_rank(config_from_tables(tables(schedule, virtual)), samples=_samples(), quiet=True)
            keys = ("steps", "seconds", "first_step_s", "pipe_len", "replicas", "microbatches")
            runs.append([{k: e[k] for k in keys} for e in result.to_dict()["epochs"]])
        out.append(runs)
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
    """Time every setting, predict its layout, write the stamped JSON and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the stamped JSON goes")
    opts = ap.parse_args([] if argv is None else argv)  # run_all.py calls main() with its own argv
    t0, load_start = time.perf_counter(), os.getloadavg()[0]
    (rounds, *_) = run_distributed(_train, WORLD, SETTINGS, ROUNDS, timeout=600)
    rows = []
    for i, (schedule, virtual) in enumerate(SETTINGS):
        runs = [r[i] for r in rounds]
        steps = [step_seconds(e) for run in runs for e in run[1:]]
        first = runs[0][0]
        plan = predicted(schedule, virtual)
        rows.append(
            {
                "schedule": schedule,
                "virtual": virtual,
                "pipe_len": first["pipe_len"],
                "replicas": first["replicas"],
                "microbatches": first["microbatches"],
                "step_ms": 1e3 * statistics.median(steps),
                "fastest_step_ms": 1e3 * min(steps),
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
        "rounds": ROUNDS,
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},  # 1-minute: the machine is shared
        "rows": rows,
        "wall_seconds": time.perf_counter() - t0,
        **provenance(),
    }
    emit(report, opts.out)
    print("\n| schedule | v | K | step ms, median | fastest epoch | vs gpipe | predicted bubble |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['schedule']} | {r['virtual']} | {r['pipe_len']} | {r['step_ms']:.1f} | {r['fastest_step_ms']:.1f} | "
            f"{r['relative_to_gpipe']:.2f} | {r['predicted_bubble']:.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
