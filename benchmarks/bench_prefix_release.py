"""The frozen prefix released while the activation cache serves it: what stage-0 ranks hold, released or resident.

Run: ``python benchmarks/bench_prefix_release.py [--out PATH]`` (CPU, gloo). Four processes train a float64 ViT through
4 -> 2 -> 1 stages with ``[pipeline] cache = "on"`` (halving compression, the manual freeze schedule {1: 4, 2: 6}),
twice: with the prefix released (:mod:`elastic_pipe.orchestrator.prefix.residency`) and with it kept resident
(release patched off in the ranks). Per rank and layout (after each epoch's transition) it records the parameter
bytes with storage (:func:`~elastic_pipe.orchestrator.transition.holdings.held_bytes`), the bytes of the frozen prefix,
the host bytes of the evaluation outputs kept beside the cache; per transition the event's
``prefix_released_bytes`` and ``bytes_moved``. Writes JSON (default ``benchmarks/results/prefix_release.json``) and
prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "prefix_release.json"
WORLD = 4
#: 18 sub-layers: the embedding, 8 blocks of two, the head.
MODEL = {"preset": "vit-tiny", "depth": 8, "dim": 128, "heads": 4, "mlp_dim": 512, "patch_size": 4}
TABLES: dict[str, Any] = {
    "model": {"name": "vit", "options": MODEL},
    "data": {"eval_fraction": 0.8},
    "train": {"epochs": 3, "dtype": "float64", "global_batch": 64, "optimizer": "adamw", "lr": 0.001},
    "freeze": {"policy": "manual", "options": {"schedule": {1: 4, 2: 6}}},
    "pipeline": {"microbatches": 2, "pipe_len": 4, "solver": "optimal", "cache": "on", "compression": "halving"},
    "launch": {"nproc_per_node": WORLD},
    "log": {"progress": False},
}
MIB = 1 << 20


def _row(trainer: Any) -> dict[str, Any]:
    from elastic_pipe.orchestrator.transition.holdings import held_bytes

    ctx, layout = trainer.ctx, trainer.state.layout
    return {
        "pipe_len": layout.pipe_len,
        "replicas": layout.replicas,
        "frozen": layout.frozen,
        "stage": int(ctx.plan(layout).stage_of(ctx.rank)),
        "released": trainer.prefix.released,
        "parameters": held_bytes(ctx)["parameters"],
        "prefix": sum(ctx.param_bytes[: layout.frozen]),
        "eval_kept": trainer.prefix.eval_bytes,
    }


def _rank(ctx: Any, release: bool) -> dict[str, Any]:
    """One rank's rows (run by :func:`elastic_pipe.testing.run_distributed`)."""
    import torch

    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.prefix import residency as prefix_residency

    torch.set_num_threads(1)
    config = config_from_tables(TABLES)
    if not release:
        prefix_residency.eligible = lambda *args: False  # type: ignore[assignment]
    rows: list[dict[str, Any]] = []
    with ElasticTrainer(config, quiet=True) as trainer:
        trainer.start()
        rows.append(_row(trainer))
        result = trainer.fit(on_epoch_end=lambda t: rows.append(_row(t)))
    return {
        "rows": rows,
        "prefix_released_bytes": [t["prefix_released_bytes"] for t in result.transitions],
        "bytes_moved": [t["bytes_moved"] for t in result.transitions],
        "eval_loss": result.final_eval_loss,
        "losses": result.losses,
    }


def main(argv: list[str] | None = None) -> None:
    """Run both variants on 4 ranks and write the results (``argv``: the options; none from ``run_all``)."""
    import torch

    from elastic_pipe.testing import run_distributed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv or [])
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the ranks import this module by name
    me = importlib.import_module("bench_prefix_release")
    runs = {
        name: run_distributed(me._rank, WORLD, release, timeout=1200)
        for name, release in (("released", True), ("resident", False))
    }
    document = {
        "benchmark": "prefix_release",
        "command": "python benchmarks/bench_prefix_release.py",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "config": TABLES,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(table(document))


def table(document: dict[str, Any]) -> str:
    """Parameter bytes per rank and layout, released against resident."""
    rel, res = document["runs"]["released"], document["runs"]["resident"]
    lines = ["rank layout stage frozen  params MiB released / resident  (prefix MiB)  eval kept MiB"]
    for rank, (a, b) in enumerate(zip(rel, res, strict=True)):
        for x, y in zip(a["rows"], b["rows"], strict=True):
            lines.append(
                f"{rank:>4} {x['pipe_len']}x{x['replicas']:<4} {x['stage']:>5} {x['frozen']:>6}  "
                f"{x['parameters'] / MIB:>8.2f} / {y['parameters'] / MIB:<8.2f}  ({x['prefix'] / MIB:>6.2f})  "
                f"{x['eval_kept'] / MIB:>12.2f}"
            )
    freed = [f"{v / MIB:.2f} MiB" for v in rel[0]["prefix_released_bytes"]]
    lines.append(f"prefix_released_bytes per transition (job total): {', '.join(freed)}")
    moved = [
        f"{a / MIB:.2f} vs {b / MIB:.2f} MiB" for a, b in zip(rel[0]["bytes_moved"], res[0]["bytes_moved"], strict=True)
    ]
    lines.append(f"bytes_moved per transition, released vs resident: {', '.join(moved)}")
    lines.append(f"final eval loss: {rel[0]['eval_loss']!r} released, {res[0]['eval_loss']!r} resident")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
