"""A dataset split's reads with each step's batch cut into one part per worker, against one worker per batch.

    python benchmarks/bench_loader_parts.py                     # -> benchmarks/results/loader_parts_cpu.json
    python benchmarks/bench_loader_parts.py --item-ms 3 --workers 8 --batch 512 --steps 12 --out X.json

``DatasetSplit`` cuts each step's list into up to ``workers`` parts of at least ``MIN_PART`` positions, one per
worker, and joins them into one batch (``loader_pool.cut``); the rows a rank reads for itself
(``DatasetSplit.input_rows``) go through a kept loader's workers the same way. Before, one worker read a whole
batch, and ``input_rows`` read in the training process. This script measures both ways side by side in one run,
on a dataset whose items each take ``--item-ms`` milliseconds to make (a sleep, standing for the file read and
decode that each worker process does on its own core: so the measurement shows what the parts change on a machine
with a core per worker, even on this 2-core one):

* ``first_batch_s``: from a split with no loader yet to the first step's batch (the workers' start and the first
  batch: what the first step of a run waits for);
* ``epoch_s``: the whole epoch of ``--steps`` steps read without training (the steady state: the same total work);
* ``input_rows_s``: ``input_rows(0, batch)`` (the set-up's profile reads it, the cache's payoff measure too).

``whole`` is today's split with its cut (``loader_pool.cut``, as the split and its loaders' parts read it) replaced
by "one part per list" (one worker per batch, rows read in this process); everything else is the same code. Each
number is the median of ``--repeats`` fresh splits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from elastic_pipe.data import ElasticSampler
from elastic_pipe.orchestrator.data import DatasetSplit, ElasticBatchSampler, dataset_split, epoch_plan, loader_pool
from elastic_pipe.orchestrator.data.items import item_spec
from elastic_pipe.orchestrator.data.loader_pool import MIN_PART

CPU = torch.device("cpu")


class SlowItems(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Item ``i``: a ``3 x 32 x 32`` float tensor and label ``i % 10``, each after ``item_ms`` of sleep."""

    def __init__(self, n: int, item_ms: float) -> None:
        self.n, self.item_s = n, item_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.item_s)
        return torch.full((3, 32, 32), float(index)), index % 10


def _one_part(positions: Sequence[int], workers: int) -> list[Sequence[int]]:
    return [positions]


@contextlib.contextmanager
def cut_into(parts: bool) -> Iterator[None]:
    """The split's reads cut into one part per worker (``parts``, today's code), or, as before the parts, one part per
    list (one worker per batch, rows in this process): the cut the split and its loaders' parts read is replaced."""
    saved = dataset_split.cut, loader_pool.cut
    if not parts:
        dataset_split.cut = loader_pool.cut = _one_part  # type: ignore[assignment]
    try:
        yield
    finally:
        dataset_split.cut, loader_pool.cut = saved


def _one(args: argparse.Namespace) -> dict[str, float]:
    n = args.batch * args.steps
    dataset = SlowItems(n, args.item_ms)
    spec = item_spec(dataset, 10)
    split = DatasetSplit(dataset, torch.arange(n), spec, torch.float32, args.workers)
    sampler = ElasticSampler(n, 1, 0, seed=0)
    sampler.set_epoch(0)
    plan = epoch_plan(n, args.batch, 1)
    try:
        t0 = time.perf_counter()
        rows = split.input_rows(0, args.batch)
        input_rows_s = time.perf_counter() - t0
        assert rows.shape[0] == args.batch
        t0 = time.perf_counter()
        batches = split.batches(ElasticBatchSampler(sampler, plan.sizes()), inputs=True, labels=True, device=CPU)
        first = next(batches)
        first_batch_s = time.perf_counter() - t0
        got = [first, *batches]
        epoch_s = time.perf_counter() - t0
        seen = sorted(int(v) for b in got for v in b.positions.tolist())
        assert seen == list(range(n)), "every sample once"
        for b in got:  # the batch is the positions' items, in order
            assert b.inputs is not None and b.inputs[:, 0, 0, 0].long().tolist() == b.positions.tolist()
    finally:
        split.close()
    return {"first_batch_s": first_batch_s, "epoch_s": epoch_s, "input_rows_s": input_rows_s}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both arms, alternating, and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--item-ms", type=float, default=2.0, help="milliseconds each item takes to make")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "loader_parts_cpu.json"))
    args = ap.parse_args([] if argv is None else argv)
    runs: dict[str, list[dict[str, float]]] = {"parts": [], "whole": []}
    for r in range(args.repeats):
        for name in ("parts", "whole"):
            with cut_into(name == "parts"):
                runs[name].append(_one(args))
            print(f"repeat {r + 1}/{args.repeats} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    medians = {name: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for name, rs in runs.items()}
    report = {
        "item_ms": args.item_ms,
        "workers": args.workers,
        "batch": args.batch,
        "steps": args.steps,
        "min_part": MIN_PART,
        "torch": torch.__version__,
        "median": medians,
        "runs": runs,
        "whole_over_parts": {k: medians["whole"][k] / medians["parts"][k] for k in medians["parts"]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"median": medians, "whole_over_parts": report["whole_over_parts"]}, indent=2))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
