"""The headline's numbers from ``headline.sh``'s results, as the rows docs/benchmarks.md keeps.

    python benchmarks/gpu/headline_table.py benchmarks/results

Prints, for ``headline_single.json``: each arm's total, compile, held-out accuracy and final loss; the speedups the
targets of issue 40 read (elastic over plain eager and over plain compiled, the fraction of the ideal, head-only
steps over their GPU time); each elastic arm's transitions by phase; and the history row of docs/benchmarks.md
("The headline's history") for the commit the file names. Reads ``headline_disk_data.json`` and
``headline_default_policy.json`` too when they are there.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

#: The phases of a transition, in the order they run (the result's ``phases``).
PHASES = ("decide", "moves", "freeze", "runner", "probe", "cache", "eval_store", "prefix")


def single(report: dict[str, Any]) -> list[str]:
    """Lines for ``headline_single.json``."""
    entry = report["steps_per_epoch"]["30"]
    arms = entry["arms"]
    lines = [f"commit {report['commit']} (src dirty: {report['dirty']}), torch {report['torch']}, {report['device']}"]
    lines.append("| arm | total (s) | compile (s) | held-out accuracy | final loss |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for name, arm in arms.items():
        lines.append(
            f"| {name} | {arm['total_s']:.2f} | {arm['compile_s']:.2f} | {arm['final_accuracy']:.3f} | "
            f"{arm['final_loss']:.3f} |"
        )
    eager = entry.get("speedup_elastic_over_plain_eager")
    best = min(arms[a]["total_s"] for a in arms if a.startswith("elastic"))
    lines.append(f"elastic eager over plain eager: {eager:.2f}x" if eager else "no eager pair")
    if "plain_compiled" in arms:
        lines.append(f"best elastic arm over plain compiled: {arms['plain_compiled']['total_s'] / best:.2f}x")
        for a, x in entry.get("speedups_over_plain_compiled", {}).items():
            lines.append(f"{a} over plain compiled: {x:.2f}x")
    if "fraction_of_ideal" in entry:
        ideal = entry["ideal"]
        lines.append(
            f"fraction of the ideal ({ideal['ideal_speedup']:.2f}x): {entry['fraction_of_ideal']:.3f}; "
            f"of the ideal with the cache fill ({ideal['ideal_speedup_with_cache_fill']:.2f}x): "
            f"{entry['elastic_over_static_eager'] / ideal['ideal_speedup_with_cache_fill']:.3f}"
        )
    for a, x in entry["head_only"]["step_over_gpu"].items():
        lines.append(f"head-only step over its GPU time, {a}: {x:.2f}x")
    for name, arm in arms.items():
        if not name.startswith("elastic"):
            continue
        lines.append(f"{name}: set-up {arm['setup_s']:.2f} s, evaluations {sum(arm['eval_seconds']):.2f} s")
        lines.append("| frozen | total (ms) | " + " | ".join(PHASES) + " |")
        for t in arm["transitions"]:
            cells = " | ".join(f"{t['phases'].get(p, 0.0) * 1e3:.0f}" for p in PHASES)
            lines.append(f"| {t['frozen']} | {t['seconds'] * 1e3:.0f} | {cells} |")
        lines.append(
            f"transitions: sum {sum(arm['transition_seconds']):.2f} s, max {max(arm['transition_seconds']):.2f} s"
        )
    compiled = arms.get("elastic_compiled_graphs", arms.get("elastic_compiled"))
    if "plain_eager" not in arms or "elastic_eager" not in arms:
        return lines  # no history row without both eager arms
    lines.append(
        f"history row: | {str(report['commit'])[:7]} | {arms['elastic_eager']['total_s']:.2f} | "
        f"{arms['plain_eager']['total_s']:.2f} | {eager:.2f}x | "
        + (
            f"{compiled['total_s']:.2f} ({compiled['compile_s']:.2f}) | {arms['plain_compiled']['total_s']:.2f} | "
            f"{arms['plain_compiled']['total_s'] / compiled['total_s']:.2f}x |"
            if compiled and "plain_compiled" in arms
            else "| | |"
        )
        + f" {sum(arms['elastic_eager']['transition_seconds']):.2f} |"
    )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="where headline.sh wrote its results")
    folder = ap.parse_args().folder
    path = folder / "headline_single.json"
    if path.exists():
        print("\n".join(single(json.loads(path.read_text()))))
    disk = folder / "headline_disk_data.json"
    if disk.exists():
        r = json.loads(disk.read_text())
        print(f"disk data at {r['commit']}:")
        for name, arm in r["arms"].items():
            if "total_s" in arm:
                print(f"  {name}: {arm['total_s']:.1f} s, accuracy {arm.get('final_accuracy', float('nan')):.3f}")
    policy = folder / "headline_default_policy.json"
    if policy.exists():
        r = json.loads(policy.read_text())
        print(f"default policy at {r['commit']} (BBC News, medians over seeds):")
        for name, arm in r["tasks"]["minilm_bbc"]["arms"].items():
            wall = statistics.median(arm["wall_seconds_by_seed"].values())
            print(f"  {name}: {arm['accuracy_mean']:.2%}, {wall:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
