"""How many of the orchestrator's files one transition visits, followed call by call (issue 42: "a newcomer can
follow a transition through <= 6 files").

Usage::

    PYTHONPATH=src python benchmarks/layout_entry_trace.py [--json] [--out PATH]

One CPU process trains the tiny ViT (3 blocks of width 16) on 160 digits for 3 epochs with a manual schedule
(unit 0 frozen before epoch 1, units 1 and 2 before epoch 2), the activation cache on. Around each transition
(``ElasticTrainer.transition``: decide, move, freeze, build the new stage, carry the cache) a profiler records
every Python call made in a module of :mod:`elastic_pipe.orchestrator`, and the report gives, per transition:

* ``files``: the orchestrator files whose code ran (a subpackage's modules count one by one);
* ``parts``: the same, a subpackage counted once (``stage/``, ``prefix/``, ...);
* ``returns``: how often control came back to a file it had already left (the "ping-pong" of issue 42), counted
  on the sequence of files of successive calls.
* ``files_within_calls``: how many of those files a reader meets following calls down from the transition's own
  function: ``{"0": 1, "1": 7, ...}`` (the entry's file; then also the files of the functions it calls; then of
  theirs, ...), every Python call counting one level, so a call through torch or a primitive counts too.

Calls into the primitives (``freeze``, ``partition``, ``protocol``, ...) and torch are left out: the measure is how
much of the orchestrator a reader follows. Results: printed, or ``--out`` as JSON with the commit.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from _report import emit, provenance  # benchmarks/gpu: where a result was measured

SAMPLES, EPOCHS = 160, 3


def _tables() -> dict[str, Any]:
    return {
        "model": {"name": "vit", "options": {"preset": "vit-tiny", "depth": 3, "dim": 16, "heads": 2, "mlp_dim": 32}},
        "data": {"dataset": "digits", "eval_fraction": 0.2},
        "train": {"epochs": EPOCHS, "global_batch": 32, "seed": 0},
        "freeze": {"policy": "manual", "options": {"schedule": {"1": 1, "2": 3}}, "decide_every": 0},
        "pipeline": {"cache": "on"},
    }


def _trace(run: Any, root: Path) -> dict[str, Any]:
    """Run ``run()`` under a profiler; the orchestrator files its calls ran in, in order, and how deep in the call
    tree (counting every Python call, the orchestrator's or not) each file's first call was."""
    prefix = str(root) + "/"
    sequence: list[str] = []
    depth, first_depth = 0, {}

    def profile(frame: Any, event: str, _arg: Any) -> None:
        nonlocal depth
        if event == "return":
            depth -= 1
            return
        if event != "call":
            return
        depth += 1
        path = frame.f_code.co_filename
        if path.startswith(prefix):
            name = path[len(prefix) :]
            first_depth[name] = min(first_depth.get(name, depth), depth)
            if not sequence or sequence[-1] != name:
                sequence.append(name)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    left: set[str] = set()
    returns = 0
    for before, after in itertools.pairwise(sequence):
        left.add(before)
        returns += after in left
    files = sorted(set(sequence))
    parts = sorted({f.split("/", 1)[0] if "/" in f else f for f in files})
    depths = sorted(first_depth.values())
    top = depths[0] if depths else 0  # the entry's own depth (the caller's frames above it do not count)
    within = {str(d - top): sum(v <= d for v in depths) for d in sorted(set(depths))}
    return {
        "files": files,
        "parts": parts,
        "returns": returns,
        "file_count": len(files),
        "part_count": len(parts),
        "files_within_calls": within,
    }


def _job(ctx: Any) -> list[dict[str, Any]]:
    from elastic_pipe import orchestrator
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    root = Path(orchestrator.__file__).resolve().parent
    traces: list[dict[str, Any]] = []
    with ElasticTrainer(config_from_tables(_tables()), quiet=True) as trainer:
        transition = trainer.transition

        def traced(*, epoch_step: int = 0) -> Any:
            out: list[Any] = []
            trace = _trace(lambda: out.append(transition(epoch_step=epoch_step)), root)
            if out[0] is not None:
                traces.append({"frozen": trainer.state.layout.frozen, **trace})
            return out[0]

        trainer.transition = traced  # type: ignore[method-assign]
        trainer.fit()
    return traces


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--out", type=Path, help="write the report (with the commit) here")
    opts = ap.parse_args(argv)
    from elastic_pipe.testing import run_distributed

    traces = run_distributed(_job, 1, timeout=300.0)[0]
    report = {"benchmark": "layout_entry_trace", **provenance(), "transitions": traces}
    if opts.out:
        emit(report, opts.out)
    if opts.json:
        print(json.dumps(report, indent=1))
        return 0
    for t in traces:
        print(
            f"to {t['frozen']} frozen sub-layers: {t['file_count']} files ({t['part_count']} parts), "
            f"{t['returns']} returns to a file already left; following calls down: "
            + ", ".join(f"{n} within {d}" for d, n in t["files_within_calls"].items())
        )
        print("  " + ", ".join(t["files"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
