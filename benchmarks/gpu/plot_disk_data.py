"""Draw the disk-data benchmark (``bench_disk_data_gpu.py``): each arm's run time as it accumulates over the epochs,
and what the host-tier arm spends beyond the device-memory arm, by part.

    python benchmarks/gpu/plot_disk_data.py benchmarks/results/gpu_1xh200_disk_data.json docs/img/gpu_disk_data.png

Needs matplotlib (``pip install 'elastic-pipe[plots]'``). Reads only the JSON the benchmark wrote.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

#: Arms drawn, with their labels.
LABELS = {
    "plain": "plain DataLoader + eager loop",
    "device_cache": "elastic, all in device memory",
    "host_cache": "elastic, from the file, cache 1/4 device + 3/4 pinned host",
}


def cumulative(arm: dict[str, Any]) -> list[float]:
    """Run time at the end of each epoch (epochs plus the transitions that came before them), from 0.

    Transition ``k`` is the ``k``-th change of the frozen count between epochs (``frozen_units``); any beyond the
    changes (none in the benchmark's runs) count with the last epoch."""
    epochs = arm["epoch_seconds"]
    moves = list(arm.get("transition_seconds", []))
    frozen = arm.get("frozen_units", [0] * len(epochs))
    changes = [e for e in range(1, len(epochs)) if frozen[e] != frozen[e - 1]]
    per_epoch = [0.0] * len(epochs)
    for k, seconds in enumerate(moves):
        per_epoch[changes[k] if k < len(changes) else len(epochs) - 1] += seconds
    out, total = [0.0], 0.0
    for e, extra in zip(epochs, per_epoch, strict=True):
        total += e + extra
        out.append(total)
    return out


def parts(host: dict[str, Any], device: dict[str, Any]) -> dict[str, float]:
    """The host arm's seconds beyond the device arm's: the first two epochs, the cached ones, the transitions and
    the rest (evaluation, setup)."""

    def split(arm: dict[str, Any]) -> dict[str, float]:
        e, moves = arm["epoch_seconds"], sum(arm.get("transition_seconds", []))
        return {
            "epochs 0-1": sum(e[:2]),
            "epochs 2+": sum(e[2:]),
            "transitions": moves,
            "the rest": arm["total_s"] - sum(e) - moves,
        }

    h, d = split(host), split(device)
    return {k: h[k] - d[k] for k in h}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    report = json.loads(args.results.read_text())
    arms = report["arms"]
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, width_ratios=[1.6, 1])
    for name, label in LABELS.items():
        if name in arms:
            ys = cumulative(arms[name])
            left.plot(range(len(ys)), ys, marker="o", label=f"{label} ({arms[name]['total_s']:.1f} s)")
    left.set_xlabel("epochs done")
    left.set_ylabel("seconds (epochs + transitions)")
    left.set_title(f"ViT-B/16, {report['images']:,} images, {report['device']}")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    if "host_cache" in arms and "device_cache" in arms:
        gap = parts(arms["host_cache"], arms["device_cache"])
        right.bar(list(gap), list(gap.values()), color="tab:green")
        right.axhline(0, color="black", linewidth=0.8)
        right.set_ylabel("seconds, host-tier arm minus device-memory arm")
        ratio = report.get("host_cache_over_device_cache")
        right.set_title(f"where the host tier's time goes ({ratio:.2f}x)" if ratio else "host tier minus device")
        right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
