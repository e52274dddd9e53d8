"""Run the embedded demo: a ViT on real digits in 2 CPU processes under a per-rank memory budget that a whole model
does not fit, trained with freezing and the activation cache - the job starts as a 2-stage pipeline and compresses
to 1 stage x 2 replicas as blocks freeze - then without freezing in the best static configuration the budget allows
(the 2-stage pipeline) for reference (:mod:`elastic_pipe.orchestrator.demo` says why this setting).

Progress goes to stderr (a bar and a summary line per epoch, one line per transition); stdout gets the result:
a table (per epoch: frozen units, pipeline length K, replicas R, loss, accuracy and seconds of both runs), or with
``--json`` one JSON document with ``budget`` (``limit_bytes``, ``training_state_bytes`` and per pipeline length at
the start ``pipe_len``, ``replicas``, ``rank_bytes``, ``fits``), ``epochs`` (``epoch``, ``loss``,
``eval_accuracy``, ``pipe_len``, ``replicas``, ``frozen_units``, ``samples_per_s``, ``seconds``), ``transitions``
(``epoch``, ``frozen``, ``pipe_len``, ``replicas``, ``seconds``), ``final_accuracy``, ``train_seconds``, the
reference under ``baseline`` (``final_accuracy``, ``train_seconds``, ``frozen_per_epoch``, ``epochs``),
``speedup``, ``accuracy_change`` (elastic minus reference), ``same_work`` (the leading epochs before the first
freeze, the same computation in both runs: ``epochs``, ``seconds``, ``baseline_seconds``; their times differ only by
the machine's load, which says how far the speedup can be trusted), ``machine`` (``cpus``,
``load_average_start``, ``load_average_end``: the 1-minute load average), ``wall_seconds`` (launch to results) and
``plot`` (the PNG written, or null). ``elastic-pipe demo --json --no-plot > benchmarks/results/demo_cpu.json``
writes the file the docs quote.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from elastic_pipe.cli._common import add_json_flag, emit

HELP = "Run the embedded demo: a ViT on real digits, 2 CPU processes, a pipeline that compresses as it freezes."

#: The PNG's name when ``--plot`` is not given: in ``--log-dir`` if there is one, else in the working directory.
DEFAULT_PLOT = "elastic-pipe-demo.png"

#: Runs doing the same work that differ in time by more than this share were timed on a machine whose load changed.
DRIFT = 0.10

#: Per-epoch fields the document keeps for each run.
EPOCH_KEYS = ("epoch", "loss", "eval_accuracy", "pipe_len", "replicas", "frozen_units", "samples_per_s", "seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 8)")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the reference (the 2-stage pipeline without freezing)"
    )
    parser.add_argument("--log-dir", default="", help="write events.jsonl (transitions and epoch metrics) here")
    parser.add_argument(
        "--plot", default=None, metavar="PATH", help=f"write the PNG here (default: {DEFAULT_PLOT} in --log-dir or .)"
    )
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    add_json_flag(parser)


def _train_seconds(result: dict[str, Any]) -> float:
    return float(sum(e["seconds"] for e in result["epochs"]) + sum(t["seconds"] for t in result["transitions"]))


def _epochs(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: e.get(k) for k in EPOCH_KEYS} for e in result["epochs"]]


def _same_work(elastic: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """The leading epochs before the first freeze: the same computation in both runs, so equal times but for load."""
    n = 0
    while n < min(len(elastic), len(baseline)) and elastic[n]["frozen_units"] == baseline[n]["frozen_units"] == 0:
        n += 1
    return {
        "epochs": n,
        "seconds": float(sum(e["seconds"] for e in elastic[:n])),
        "baseline_seconds": float(sum(e["seconds"] for e in baseline[:n])),
    }


def summarize(results: dict[str, Any], budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """The demo's JSON document from the runs' results (``{"elastic": ..., "baseline": ...}``) and the memory
    budget's report (:func:`elastic_pipe.orchestrator.demo.budget_report`)."""
    elastic = results["elastic"]
    doc: dict[str, Any] = {
        "budget": budget,
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
        "epochs": _epochs(elastic),
    }
    if "baseline" in results:
        base = results["baseline"]
        doc["baseline"] = {
            "final_accuracy": base["final_accuracy"],
            "train_seconds": _train_seconds(base),
            "frozen_per_epoch": [e["frozen_units"] for e in base["epochs"]],
            "epochs": _epochs(base),
        }
        doc["speedup"] = doc["baseline"]["train_seconds"] / doc["train_seconds"] if doc["train_seconds"] else None
        accuracies = (doc["final_accuracy"], base["final_accuracy"])
        doc["accuracy_change"] = None if None in accuracies else accuracies[0] - accuracies[1]
        doc["same_work"] = _same_work(elastic["epochs"], base["epochs"])
    cores = os.cpu_count() or 1
    # Both runs use as many processes (the same world size); the elastic run's layouts say how many.
    processes = max((e["pipe_len"] * e["replicas"] for e in doc["epochs"]), default=1)
    if cores < processes:
        # Replicas only pay where each process has its own core or device; here they time-share the cores, and
        # every gradient all-reduce waits for the process that was descheduled last.
        doc["note"] = (
            f"{processes} processes share {cores} CPU cores here, so the timings mostly measure the time-sharing: "
            "docs/benchmarks.md has the speed on GPUs"
        )
    doc["plot"] = None
    return doc


def _accuracy(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _budget_lines(budget: dict[str, Any]) -> list[str]:
    starts = ", ".join(
        f"K={s['pipe_len']} R={s['replicas']} {_mib(s['rank_bytes'])} ({'fits' if s['fits'] else 'does not fit'})"
        for s in budget["start"]
    )
    return [
        f"memory budget {_mib(budget['limit_bytes'])} a rank (weights, gradients and optimizer state; the whole "
        f"model's: {_mib(budget['training_state_bytes'])})",
        f"at the start, the fullest rank holds: {starts}",
    ]


def render(doc: dict[str, Any]) -> str:
    """The demo's result as text: per epoch the layout (frozen units, K stages, R replicas) of both runs."""
    lines = _budget_lines(doc["budget"]) if doc.get("budget") else []
    base = doc["baseline"]["epochs"] if "baseline" in doc else []
    lines.append(
        "epoch  frozen  K  R  loss    accuracy  seconds" + ("  | reference K  R  accuracy  seconds" if base else "")
    )
    for i, e in enumerate(doc["epochs"]):
        line = (
            f"{e['epoch'] + 1:>5}  {e['frozen_units']:>6}  {e['pipe_len']}  {e['replicas']}  "
            f"{e['loss']:.4f}  {_accuracy(e['eval_accuracy']):>8}  {e['seconds']:7.2f}"
        )
        if i < len(base):
            b = base[i]
            line += (
                f"  |           {b['pipe_len']}  {b['replicas']}  {_accuracy(b['eval_accuracy']):>8}  "
                f"{b['seconds']:7.2f}"
            )
        lines.append(line)
    for t in doc["transitions"]:
        lines.append(
            f"transition before epoch {t['epoch'] + 1}: frozen {t['frozen']}, pipeline {t['pipe_len']}, "
            f"replicas {t['replicas']}, {t['seconds']:.3f} s"
        )
    accuracy, seconds = _accuracy(doc["final_accuracy"]), doc["train_seconds"]
    lines.append(f"with freezing: final accuracy {accuracy}, training {seconds:.1f} s")
    if "baseline" in doc:
        b = doc["baseline"]
        lines.append(
            f"without freezing: final accuracy {_accuracy(b['final_accuracy'])}, training {b['train_seconds']:.1f} s"
        )
        change = doc.get("accuracy_change")
        points = "" if change is None else f", accuracy {100 * change:+.1f} points"
        speedup = "-" if doc["speedup"] is None else f"{doc['speedup']:.2f}x"
        lines.append(f"-> freezing is {speedup} as fast{points}")
        same = doc["same_work"]
        if same["epochs"]:
            a, b = same["seconds"], same["baseline_seconds"]
            span = "epoch 1" if same["epochs"] == 1 else f"epochs 1-{same['epochs']}"
            line = f"{span} did the same work in both runs: {a:.1f} s and {b:.1f} s"
            if b and abs(a / b - 1.0) > DRIFT:
                line += " (the machine's load changed between the runs, so the speedup is only approximate)"
            lines.append(line)
    if doc.get("wall_seconds") is not None:
        m = doc["machine"]
        lines.append(
            f"wall {doc['wall_seconds']:.1f} s on {m['cpus']} CPU cores, load average "
            f"{m['load_average_start']:.1f} -> {m['load_average_end']:.1f}"
        )
    if doc.get("plot"):
        lines.append(f"plot: {doc['plot']}")
    if "note" in doc:
        lines.append(f"note: {doc['note']}")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str) -> None:
    """Throughput, both runs' held-out accuracy, and the layout (K stages, R replicas, frozen units) per epoch, in
    one PNG.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib  # noqa: PLC0415 - optional extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - optional extra

    runs = [("with freezing", doc["epochs"])]
    if "baseline" in doc:
        runs.append(("without freezing", doc["baseline"]["epochs"]))
    fig, (speed, acc, shape) = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for label, epochs in runs:
        x = [e["epoch"] + 1 for e in epochs]
        speed.plot(x, [e["samples_per_s"] or math.nan for e in epochs], marker="o", label=label)
        accuracy = [math.nan if e["eval_accuracy"] is None else e["eval_accuracy"] for e in epochs]
        acc.plot(x, accuracy, marker="o", label=label)
    x = [e["epoch"] + 1 for e in doc["epochs"]]
    for key, label, style in (
        ("pipe_len", "K stages", "-"),
        ("replicas", "R replicas", "-"),
        ("frozen_units", "frozen units", "--"),
    ):
        shape.step(x, [e[key] for e in doc["epochs"]], where="mid", linestyle=style, marker="o", label=label)
    if "baseline" in doc:
        base = doc["baseline"]["epochs"]
        shape.step(
            [e["epoch"] + 1 for e in base],
            [e["pipe_len"] for e in base],
            where="mid",
            linestyle=":",
            color="gray",
            label="K without freezing",
        )
    speed.set_ylabel("training samples/s")
    speed.set_title("elastic-pipe demo: a pipeline that compresses as it freezes")
    speed.legend(loc="upper left")
    acc.set_ylabel("held-out accuracy")
    acc.legend(loc="lower right")
    shape.set_ylabel("layout with freezing")
    shape.set_xlabel("epoch")
    shape.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_path(args: argparse.Namespace) -> str | None:
    """Where the PNG goes: ``--plot``, else :data:`DEFAULT_PLOT` in ``--log-dir`` or the working directory."""
    if args.no_plot:
        return None
    if args.plot:
        return str(args.plot)
    return str(Path(args.log_dir or ".") / DEFAULT_PLOT)


def run(args: argparse.Namespace) -> int:
    """Run the demo and print its result."""
    # torch and the primitives load only when the command runs, so that `elastic-pipe --help` stays fast.
    from elastic_pipe.orchestrator import preflight  # noqa: PLC0415
    from elastic_pipe.orchestrator.demo import budget_report, demo_config, run_demo  # noqa: PLC0415

    overrides: dict[str, Any] = {"log.dir": args.log_dir}
    if args.epochs is not None:
        overrides["train.epochs"] = args.epochs
    config = demo_config(overrides)
    preflight(config)
    load_start, start = os.getloadavg()[0], time.perf_counter()
    doc = summarize(run_demo(config, baseline=not args.no_baseline), budget_report(config))
    doc["wall_seconds"] = time.perf_counter() - start
    doc["machine"] = {"cpus": os.cpu_count(), "load_average_start": load_start, "load_average_end": os.getloadavg()[0]}
    path = plot_path(args)
    if path is not None:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            plot(doc, path)
            doc["plot"] = str(Path(path).resolve())
        except ImportError:
            sys.stderr.write("no plot written: it needs matplotlib (pip install 'elastic-pipe[plots]')\n")
    emit(args, doc, render(doc))
    return 0
