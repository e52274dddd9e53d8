"""Run the embedded demo: a small ViT on real digits, 4 CPU processes, the pipeline going 4 -> 2 -> 1 as layers
freeze while replicas go 1 -> 2 -> 4, then the same run without reshaping for comparison.

Progress goes to stderr (a bar and a summary line per epoch, one line per transition); stdout gets the result:
a table, or with ``--json`` one JSON document with ``transitions`` (``epoch``, ``frozen``, ``pipe_len``,
``replicas``, ``seconds``), ``final_accuracy`` and the comparison.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from elastic_pipe.cli._common import add_json_flag, emit

HELP = "Run the embedded demo: a small ViT on real digits, 4 CPU processes, pipeline 4 -> 2 -> 1."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 6)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the comparison run without reshaping")
    parser.add_argument("--log-dir", default="", help="write events.jsonl (transitions and epoch metrics) here")
    add_json_flag(parser)


def _train_seconds(result: dict[str, Any]) -> float:
    return float(sum(e["seconds"] for e in result["epochs"]) + sum(t["seconds"] for t in result["transitions"]))


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """The demo's JSON document from the runs' results."""
    elastic = results["elastic"]
    doc: dict[str, Any] = {
        "transitions": [
            {
                "epoch": t["epoch"],
                "frozen": t["frozen_units"],
                "pipe_len": t["pipe_len"],
                "replicas": t["replicas"],
                "seconds": t["seconds"],
            }
            for t in elastic["transitions"]
        ],
        "final_accuracy": elastic["final_accuracy"],
        "train_seconds": _train_seconds(elastic),
        "epochs": [
            {k: e[k] for k in ("epoch", "loss", "eval_accuracy", "pipe_len", "replicas", "frozen_units", "seconds")}
            for e in elastic["epochs"]
        ],
    }
    if "baseline" in results:
        base = results["baseline"]
        doc["baseline"] = {
            "final_accuracy": base["final_accuracy"],
            "train_seconds": _train_seconds(base),
            "frozen_per_epoch": [e["frozen_units"] for e in base["epochs"]],
        }
        doc["speedup"] = doc["baseline"]["train_seconds"] / doc["train_seconds"] if doc["train_seconds"] else None
    cores = os.cpu_count() or 1
    processes = max((e["pipe_len"] * e["replicas"] for e in doc["epochs"]), default=1)
    if cores < processes:
        # Replicas only pay where each process has its own device; here they time-share the cores, and every
        # gradient all-reduce waits for the process that was descheduled last.
        doc["note"] = (
            f"{processes} processes share {cores} CPU cores here, so more replicas cannot run faster than one "
            "pipeline: the demo shows the mechanics and the accuracy; docs/benchmarks.md has the speed on GPUs"
        )
    return doc


def render(doc: dict[str, Any]) -> str:
    """The demo's result as text."""
    lines = ["epoch  frozen  K  R  loss    accuracy  seconds"]
    for e in doc["epochs"]:
        acc = "-" if e["eval_accuracy"] is None else f"{e['eval_accuracy']:.3f}"
        lines.append(
            f"{e['epoch'] + 1:>5}  {e['frozen_units']:>6}  {e['pipe_len']}  {e['replicas']}  "
            f"{e['loss']:.4f}  {acc:>8}  {e['seconds']:7.2f}"
        )
    for t in doc["transitions"]:
        lines.append(
            f"transition before epoch {t['epoch'] + 1}: frozen {t['frozen']}, pipeline {t['pipe_len']}, "
            f"replicas {t['replicas']}, {t['seconds']:.3f} s"
        )
    lines.append(f"final accuracy {doc['final_accuracy']:.3f}, training {doc['train_seconds']:.1f} s")
    if "baseline" in doc:
        b = doc["baseline"]
        lines.append(
            f"without reshaping: final accuracy {b['final_accuracy']:.3f}, training {b['train_seconds']:.1f} s "
            f"-> elastic is {doc['speedup']:.2f}x as fast"
        )
    if "note" in doc:
        lines.append(f"note: {doc['note']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its result."""
    # torch and the primitives load only when the command runs, so that `elastic-pipe --help` stays fast.
    from elastic_pipe.orchestrator.demo import demo_config, run_demo  # noqa: PLC0415
    from elastic_pipe.orchestrator.preflight import preflight  # noqa: PLC0415

    overrides: dict[str, Any] = {"log.dir": args.log_dir}
    if args.epochs is not None:
        overrides["train.epochs"] = args.epochs
    config = demo_config(overrides)
    preflight(config)
    doc = summarize(run_demo(config, baseline=not args.no_baseline))
    emit(args, doc, render(doc))
    return 0
