"""Draw the trainer-callback benchmark: held-out accuracy against wall time, every arm and seed, one panel a job.

    python benchmarks/gpu/plot_hf_callback.py docs/img/hf_callback.png \\
        benchmarks/results/gpu_1xh100_hf_callback.json benchmarks/results/gpu_1xh100_hf_callback_8epochs.json

Needs matplotlib (``pip install 'elastic-pipe[plots]'``). Reads only the JSONs that ``bench_hf_callback.py`` wrote:
a small marker per seed, a large one at each arm's mean, and the no-callback arm's mean accuracy and time as
dotted lines and that accuracy less :data:`TOLERANCE` dashed, so "as accurate, sooner" is the region left of
the vertical line and above the dashed one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: Accuracy points an arm may lose against the no-callback arm's mean (issue 46's target), drawn as a line.
TOLERANCE = 0.5

#: Arms drawn, in legend order: label, colour, marker.
ARMS = {
    "none": ("no callback", "tab:gray", "o"),
    "freeze": ("FreezeCallback(cache=True)", "tab:blue", "s"),
    "freeze_nocache": ("FreezeCallback(cache=False)", "tab:cyan", "D"),
    "lora": ("peft LoRA", "tab:orange", "^"),
}


#: The trainers' names in the results (``--trainer``), as titles say them.
TRAINERS = {"hf": "HF Trainer", "lightning": "Lightning"}


def title(report: dict[str, Any]) -> str:
    """The panel's title: trainer, epochs, device and commit of one job."""
    trainer = TRAINERS.get(report["trainer"], report["trainer"])
    return f"{trainer}, {report['settings']['epochs']} epochs, {report['device']} at {report['commit'][:7]}"


def draw(reports: list[dict[str, Any]]) -> Figure:
    """One panel per job: a point per arm and seed (accuracy in %, wall seconds), the arm's mean larger."""
    if not reports:
        raise ValueError("draw needs at least one bench_hf_callback result")
    fig = Figure(figsize=(5.2 * len(reports), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(reports), squeeze=False)[0]
    for ax, report in zip(axes, reports, strict=True):
        arms = report["arms"]
        for name, (label, colour, marker) in ARMS.items():
            if name not in arms:
                continue
            arm = arms[name]
            walls, accs = arm["wall_seconds_by_seed"], [100 * a for a in arm["accuracy_by_seed"]]
            ax.scatter(walls, accs, color=colour, marker=marker, s=22, alpha=0.55)
            ax.scatter([arm["wall_seconds_mean"]], [100 * arm["accuracy_mean"]], color=colour, marker=marker, s=110,
                       edgecolors="black", label=f"{label}: {arm['wall_seconds_mean']:.2f} s")  # fmt: skip
        if "none" in arms:
            ax.axvline(arms["none"]["wall_seconds_mean"], color="tab:gray", linestyle=":", linewidth=1)
            ax.axhline(100 * arms["none"]["accuracy_mean"], color="tab:gray", linestyle=":", linewidth=1)
            ax.axhline(100 * arms["none"]["accuracy_mean"] - TOLERANCE, color="tab:red", linestyle="--",
                       linewidth=1, label=f"no callback's mean - {TOLERANCE} points")  # fmt: skip
        ax.set_title(title(report), fontsize=9)
        ax.set_xlabel("wall seconds per run (everything counted)")
        ax.set_ylabel("held-out accuracy (%)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        ax.grid(alpha=0.3)
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("results", type=Path, nargs="+", help="bench_hf_callback.py JSONs, one panel each")
    args = ap.parse_args()
    reports = [json.loads(path.read_text()) for path in args.results]
    draw(reports).savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
