"""Stage residency: what each of 4 gloo ranks holds while a ViT trains through 4 -> 2 -> 1 stages, on CPU.

Run: ``python benchmarks/bench_residency.py`` (or ``nox -s bench``). Writes ``benchmarks/results/residency.json``
and prints a table. Four processes train the same run through :class:`elastic_pipe.orchestrator.ElasticTrainer`
(AdamW, float64, the manual freeze schedule {1: 4, 2: 6}, halving compression, cache off).

Per rank and layout (at the start, then after each epoch's transition):

* ``parameters`` / ``optimizer``: bytes of the parameters with storage and of the optimizer's state tensors
  (:func:`elastic_pipe.orchestrator.transition.holdings.held_bytes`), next to the stage's share (the parameters of the
  sub-layers the rank holds - its stage's, plus the frozen prefix on stage 0 - and AdamW's two moments of the ones
  it trains) and to the whole model;
* ``rss``: the process's resident set when the layout starts (``VmRSS`` of ``/proc/self/status``);
  ``peak_train``: its high-water mark (``VmHWM``) over the epoch trained in the layout, evaluation included;
  ``peak_transition``: the mark over the transition into the layout. The mark is reset through
  ``/proc/self/clear_refs`` before each. ``rss_base`` is taken after the imports, before the model is built,
  ``rss_built`` once the trainer has built it (on the meta device: shapes, no storage).

Per rank, the setup: ``peak_setup`` is the high-water mark from before the model is built until the first layout
is entered (:meth:`~elastic_pipe.orchestrator.ElasticTrainer.start`: the groups, the boundary examples run one
sub-layer at a time, the rank materializing its own sub-layers), ``rss_setup`` the resident set then. For
comparison, ``setup_whole_build`` repeats only the setup with the model built whole on the CPU first and passed to
the trainer (``model=build_model(config)``, what every rank did before the meta build): there the peak holds the
whole model, here the rank's stage.

The processes run with ``MALLOC_MMAP_THRESHOLD_`` fixed (64 KiB): glibc otherwise raises its mmap threshold after
the first large free, and later frees of released sub-layers stay in the heap, where RSS cannot show them.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "residency.json"
WORLD = 4
#: 18 sub-layers: the embedding, 8 blocks of two, the head; float64, so parameters and AdamW moments are 8 bytes.
MODEL = {"preset": "vit-tiny", "depth": 8, "dim": 384, "heads": 4, "mlp_dim": 1536, "patch_size": 4}
TABLES: dict[str, Any] = {
    "model": {"name": "vit", "options": MODEL},
    "data": {"eval_fraction": 0.9},  # 180 training samples: 3 steps of 64 an epoch keep it short on CPU
    "train": {"epochs": 3, "dtype": "float64", "global_batch": 64, "optimizer": "adamw", "lr": 0.001},
    "freeze": {"policy": "manual", "options": {"schedule": {1: 4, 2: 6}}},
    "pipeline": {"microbatches": 2, "pipe_len": 4, "solver": "optimal", "cache": "off", "compression": "halving"},
    "launch": {"nproc_per_node": WORLD},
    "log": {"progress": False},
}
#: glibc's mmap threshold in the ranks (see the module docstring).
MMAP_THRESHOLD = 1 << 16
MIB = 1 << 20


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _row(trainer: Any) -> dict[str, Any]:
    from elastic_pipe.orchestrator.transition.holdings import held_bytes

    ctx, layout = trainer.ctx, trainer.state.layout
    held = ctx.held(layout)
    sizes = ctx.param_bytes
    trained = [j for j in ctx.owned(layout) if j >= layout.frozen]
    return {
        "pipe_len": layout.pipe_len,
        "replicas": layout.replicas,
        "frozen": layout.frozen,
        "stage": int(ctx.plan(layout).stage_of(ctx.rank)),
        "held": [held[0], held[-1] + 1] if held else [],
        **held_bytes(ctx, trainer.optimizer),
        "share_parameters": sum(sizes[j] for j in held),
        "share_optimizer": 2 * sum(sizes[j] for j in trained),
        "rss": _status("VmRSS"),
    }


def _rank(ctx: Any) -> dict[str, Any]:
    """One rank's rows (run by :func:`elastic_pipe.testing.run_distributed`)."""
    import torch

    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    torch.set_num_threads(1)
    config = config_from_tables(TABLES)
    base = _status("VmRSS")
    _reset_peak()
    rows: list[dict[str, Any]] = []
    transitioned = [False]
    with ElasticTrainer(config, quiet=True) as trainer:
        built = _status("VmRSS")
        trainer.start()
        setup = {"peak_setup": _status("VmHWM"), "rss_setup": _status("VmRSS")}
        rows.append(_row(trainer))
        _reset_peak()
        decide = trainer.transition

        def transition() -> Any:  # the epoch in the current layout ends here: its peak, then the transition's
            rows[-1]["peak_train"] = _status("VmHWM")
            _reset_peak()
            transitioned[0] = True
            return decide()

        def epoch_end(t: Any) -> None:
            if transitioned[0]:
                rows.append({**_row(t), "peak_transition": _status("VmHWM")})
                transitioned[0] = False
            else:  # the last epoch: no transition after it
                rows[-1]["peak_train"] = _status("VmHWM")
            _reset_peak()

        trainer.transition = transition  # type: ignore[method-assign]
        result = trainer.fit(on_epoch_end=epoch_end)
        moved = [t["bytes_moved"] for t in result.transitions]
    return {
        "rss_base": base,
        "rss_built": built,
        **setup,
        "rows": rows,
        "bytes_moved": moved,
        "losses": result.losses,
    }


def _whole_build_setup(ctx: Any) -> dict[str, Any]:
    """One rank's setup with the model built whole on the CPU first (the comparison; no training)."""
    import torch

    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.components import build_model

    torch.set_num_threads(1)
    config = config_from_tables(TABLES)
    base = _status("VmRSS")
    _reset_peak()
    model = build_model(config)
    built = _status("VmRSS")
    with ElasticTrainer(config, model=model, quiet=True) as trainer:
        del model
        trainer.start()
        return {"rss_base": base, "rss_built": built, "peak_setup": _status("VmHWM"), "rss_setup": _status("VmRSS")}


def main() -> None:
    """Run the 4 ranks and write the results."""
    import torch

    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.config import config_from_tables
    from elastic_pipe.orchestrator.setup import param_bytes
    from elastic_pipe.testing import run_distributed

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the ranks import this module by name
    me = importlib.import_module("bench_residency")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    sizes = param_bytes(build_model(config_from_tables(TABLES), meta=True))
    whole = sum(sizes)
    results = run_distributed(me._rank, WORLD, timeout=1200)
    whole_build = run_distributed(me._whole_build_setup, WORLD, timeout=1200)
    document = {
        "benchmark": "residency",
        "command": "python benchmarks/bench_residency.py",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "config": TABLES,
        "whole_model": {"parameters": whole, "training_state": 4 * whole, "sublayers": len(sizes)},
        "ranks": results,
        "setup_whole_build": whole_build,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(table(document))


def table(document: dict[str, Any]) -> str:
    """The results as a text table, one line per rank and layout."""
    whole = document["whole_model"]
    lines = [
        f"whole model: {whole['parameters'] / MIB:.1f} MiB of parameters, "
        f"{whole['training_state'] / MIB:.1f} MiB of training state (weights, gradients, AdamW moments)",
        "rank layout stage held     params MiB (share)  optim MiB (share)   rss  peak train  peak trans",
    ]
    for rank, r in enumerate(document["ranks"]):
        for row in r["rows"]:
            trans = row.get("peak_transition")
            lines.append(
                f"{rank:>4} {row['pipe_len']}x{row['replicas']:<4} {row['stage']:>5} {row['held']!s:<8} "
                f"{row['parameters'] / MIB:>6.1f} ({row['share_parameters'] / MIB:>6.1f})  "
                f"{row['optimizer'] / MIB:>6.1f} ({row['share_optimizer'] / MIB:>6.1f})  "
                f"{row['rss'] / MIB:>5.0f}  {row['peak_train'] / MIB:>10.0f}  "
                f"{'-' if trans is None else f'{trans / MIB:.0f}':>10}"
            )
        lines.append(
            f"     (rank {rank}: rss {r['rss_base'] / MIB:.0f} MiB before the model, {r['rss_built'] / MIB:.0f} built)"
        )
    lines.append("setup peak RSS per rank, MiB (model built on meta; built whole on the CPU first):")
    for rank, (r, w) in enumerate(zip(document["ranks"], document.get("setup_whole_build", []), strict=False)):
        held = r["rows"][0]
        lines.append(
            f"{rank:>4} stage {held['stage']} ({held['share_parameters'] / MIB:.1f} MiB of parameters): "
            f"{r['peak_setup'] / MIB:.0f}; whole build {w['peak_setup'] / MIB:.0f} "
            f"(before the model {r['rss_base'] / MIB:.0f} / {w['rss_base'] / MIB:.0f})"
        )
    moved = [f"{b / MIB:.1f} MiB" for b in document["ranks"][0]["bytes_moved"]]
    lines.append(f"bytes received per transition (job total): {', '.join(moved)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
