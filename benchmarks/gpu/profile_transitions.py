"""Where a transition's time goes: the single-GPU headline's elastic arm, one row per transition, one column per phase.

    torchrun --standalone --nproc-per-node 1 benchmarks/gpu/profile_transitions.py --out $OUT
    torchrun --standalone --nproc-per-node 1 benchmarks/gpu/profile_transitions.py --tiny   # CPU smoke run
    ... profile_transitions.py --trace 3   # also torch.profiler's top operators of the 3 slowest transitions

The run is ``bench_single_gpu.py``'s ``elastic_eager`` arm (ViT-B/16 at 224 px, batch 512, 30 steps per epoch, 10
epochs, alpha = 1/3, the whole training split cached in device memory; ``--compiled``/``--graphs`` for the other
arms). Each transition event carries its phases
(:data:`elastic_pipe.orchestrator.apply_transition.TRANSITION_PHASES`, plus ``decide`` before them and
``compile``/``capture`` that the layout's first epoch paid) and the cache entries and bytes it carried; the table
prints them, and ``--out`` gets ``profile_transitions.json`` with the commit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import emit, provenance  # this folder
from _traced_trainer import TracedTrainer, slowest
from bench_elastic_gpu import workload
from bench_single_gpu import elastic_config, learnable_samples
from elastic_pipe.orchestrator import ElasticTrainer
from elastic_pipe.orchestrator.data import Split

#: Phase columns, in the order a transition runs them.
COLUMNS = ("decide", "moves", "freeze", "runner", "probe", "cache", "eval_store", "prefix", "compile", "capture")


def table(transitions: list[dict[str, Any]]) -> str:
    """The phases of each transition as a text table (milliseconds)."""
    head = f"{'epoch':>5} {'frozen':>6} {'total':>8} " + " ".join(f"{c:>10}" for c in COLUMNS) + "  entries   MB"
    rows = [head]
    for t in transitions:
        phases = t["phases"]
        cells = " ".join(f"{phases.get(c, 0.0) * 1e3:10.1f}" for c in COLUMNS)
        rows.append(
            f"{t['epoch']:>5} {t['frozen']:>6} {t['seconds'] * 1e3:8.1f} {cells}  {t['cache_entries']:>7} "
            f"{t['cache_bytes'] / 2**20:6.0f}"
        )
    total = sum(t["seconds"] for t in transitions)
    rows.append(
        f"transitions: {len(transitions)}, sum {total:.3f} s, max {max(t['seconds'] for t in transitions):.3f} s"
    )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="steps per epoch")
    ap.add_argument("--tiny", action="store_true", help="a tiny ViT on the CPU: checks the script runs")
    ap.add_argument("--compiled", action="store_true", help="torch.compile the stages (the compiled arms)")
    ap.add_argument("--graphs", action="store_true", help='[train] cuda_graphs = "auto"')
    ap.add_argument("--cache-mb", type=int, default=16384, help="device cache budget (the whole split fits)")
    ap.add_argument("--trace", type=int, default=0, help="print torch.profiler's top operators of the N slowest")
    ap.add_argument("--out", default=None, help="folder of profile_transitions.json")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    w = workload("vit", args.tiny, device, 1)
    batch = w["global_batch"]
    n = int(batch * args.steps / 0.95) + 1
    x, y = learnable_samples(n, tuple(w["samples"].inputs.shape[1:]))
    samples = Split(x.to(device), y.to(device), torch.arange(n, device=device))
    config = elastic_config(
        batch=batch, freeze=True, compiled=args.compiled, graphs=args.graphs, cache_mb=args.cache_mb
    )
    torch.manual_seed(0)
    kind = TracedTrainer if args.trace else ElasticTrainer
    with kind(config, model=w["build"](), data=samples, quiet=True) as trainer:
        result = trainer.fit().to_dict()
        traces = getattr(trainer, "traces", [])
    print(table(result["transitions"]), flush=True)
    if args.trace:
        print(slowest(traces, args.trace), flush=True)
    report = {
        **provenance(),
        "workload": "vit-tiny" if args.tiny else "vit-b16",
        "global_batch": batch,
        "steps_per_epoch": args.steps,
        "compiled": args.compiled,
        "graphs": args.graphs,
        "total_s": result["seconds"],
        "final_accuracy": result["final_accuracy"],
        "transitions": result["transitions"],
    }
    emit(report, Path(args.out) / "profile_transitions.json" if args.out else None)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
