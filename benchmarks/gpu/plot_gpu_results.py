"""Draw the GPU benchmark's results: per-epoch throughput of every arm, and where each arm's run time went.

    python benchmarks/gpu/plot_gpu_results.py benchmarks/results/gpu_2xh200_vit.json docs/img/gpu_vit.png
    python benchmarks/gpu/plot_gpu_results.py benchmarks/results/gpu_2xh200_gpt.json docs/img/gpu_gpt.png

Needs matplotlib (``pip install 'elastic-pipe[plots]'``). Reads only the JSON that ``bench_elastic_gpu.py`` wrote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

#: Arms drawn, in legend order, with their labels.
LABELS = {
    "static_ddp": "static DDP",
    "static_torch_ddp": "static torch DDP",
    "static_pipe2_1f1b_m4": "static 2-stage 1F1B M=4",
    "static_pipe2_gpipe_m4": "static 2-stage GPipe M=4",
    "freeze_only": "freezing only",
    "elastic_nocache": "elastic, no cache",
    "elastic_cache": "elastic + cache",
}


def draw(report: dict[str, Any]) -> Figure:
    """Two panels per workload: samples/s by epoch (log scale), and run time split into epochs and transitions."""
    workloads = report["workloads"]
    fig = Figure(figsize=(11, 3.6 * len(workloads)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(workloads), 2, squeeze=False)
    for row, (name, summary) in zip(axes, workloads.items(), strict=True):
        arms = {k: v for k, v in summary["arms"].items() if k in LABELS and "error" not in v}
        baseline = summary["baseline"]
        fits = summary.get("fits_budget") or {}
        labels = {k: LABELS[k] + ("" if fits.get(k, True) else " (over budget)") for k in arms}
        for key, arm in arms.items():
            epochs = range(1, len(arm["samples_per_s"]) + 1)
            style = "--" if key.startswith("static") else "-"
            row[0].plot(epochs, arm["samples_per_s"], style, marker="o", ms=3, label=labels[key])
        row[0].set_yscale("log")
        row[0].set_xlabel("epoch")
        row[0].set_ylabel("samples/s")
        row[0].set_title(f"{name}: throughput by epoch")
        row[0].legend(fontsize=7)
        keys = list(arms)
        run = [summary["run_seconds"][k] for k in keys]
        transitions = [summary["transition_seconds_total"][k] for k in keys]
        epochs_only = [r - t for r, t in zip(run, transitions, strict=True)]
        y = range(len(keys))
        over = ["//" if not fits.get(k, True) else "" for k in keys]
        row[1].barh(y, epochs_only, color="C0", hatch=over)
        row[1].barh(y, transitions, left=epochs_only, color="C1")
        row[1].set_yticks(list(y), [labels[k] for k in keys], fontsize=8)
        row[1].invert_yaxis()
        for i, key in enumerate(keys):
            speedup = summary["speedup_over_baseline"][key]
            row[1].text(run[i], i, f" {speedup:.2f}x", va="center", fontsize=8)
        row[1].set_xlim(0, max(run) * 1.15)  # room for the speedup labels
        row[1].set_xlabel(f"run time over {report['epochs']} epochs (s)")
        row[1].set_title(
            f"{name}: run time and speedup over {LABELS.get(baseline, baseline)}\n"
            f"(ideal {summary['ideal_speedup']:.2f}x; hatched: over the memory budget)",
            fontsize=10,
        )
        legend = [Patch(color="C0", label="epochs"), Patch(color="C1", label="transitions")]
        row[1].legend(handles=legend, fontsize=7, loc="lower right")
    fig.suptitle(f"{report['gpus']}x {report['device']}, alpha = 1/3, every arm in one job")
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a gpu_*.json written by bench_elastic_gpu.py")
    ap.add_argument("out", type=Path, help="the PNG to write")
    args = ap.parse_args()
    report = json.loads(args.results.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draw(report).savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
