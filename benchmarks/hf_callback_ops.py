"""How much host work the HF Trainer callback can take out of a step: the operations a training step dispatches,
counted on the CPU, by how many blocks are frozen and how the step meets the cache.

On one GPU a short fine-tune of a small model is host-bound (docs/integrations.md, "Measured"): a step's time is
the host's work of dispatching its operations, not the GPU's. What freezing saves there is dispatched operations,
so their count per step is the measure, and it does not depend on the sequence length or the batch size. Each run
trains the pretrained MiniLM-L6 (BBC News, as ``gpu/bench_hf_callback.py``) under ``transformers.Trainer`` for 3
epochs, ``k`` of its 6 blocks frozen after the first (``freeze.ManualSchedule``), and counts the ATen operations
of every optimizer step (forward, backward, clipping, the optimizer's update, the callback's own work) with a
``TorchDispatchMode``. The arms: no callback; ``FreezeCallback(cache=False)``; ``FreezeCallback(cache=True)``,
whose epoch 1 fills the boundary (its first batch also runs the check) and epoch 2 is served.

    python benchmarks/hf_callback_ops.py --out benchmarks/results/hf_callback_ops_cpu.json

Prints, per frozen count, the operations of a step in epoch 2 for each arm and their share of a step without the
callback; then, for a run's freeze schedule (``--schedule``, default the HF job's seed 0 at 2d73ab9: steps 24, 36,
84, 168 of 200), its steps' operations with every frozen step paid as each arm pays it - without the cache, filled
in the step, served - against no freezing: bounds on what freezing and the cache can save of a host-bound run's
step work (a run also loads the model and evaluates, which no arm shortens).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from _report import emit, provenance  # benchmarks/gpu
from bench_hf_callback import Docs, bbc, build  # benchmarks/gpu
from elastic_pipe import freeze

BLOCKS, EPOCHS, BATCH = 6, 3, 16


class _Count(TorchDispatchMode):
    """Counts the ATen operations dispatched while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


class OpsPerStep(TrainerCallback):
    """A Trainer callback: the ATen operations each optimizer step dispatches (forward, backward, clipping, the
    update, the other callbacks' work), as ``steps``: (epoch, operations) per step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []
        self._mode: _Count | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._mode = _Count()
        self._mode.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self._mode is not None
        self._mode.__exit__(None, None, None)
        self.steps.append((int(state.epoch - 1e-9), self._mode.ops))

    def by_epoch(self, epochs: int) -> dict[str, list[int]]:
        """The steps' operations, by epoch."""
        return {str(e): [ops for epoch, ops in self.steps if epoch == e] for e in range(epochs)}


def run(arm: str, frozen: int, data: dict[str, Any]) -> dict[str, list[int]]:
    """One run; returns the operations per optimizer step, by epoch."""
    from transformers import Trainer, TrainingArguments

    from elastic_pipe.integrations.transformers import FreezeCallback

    count = OpsPerStep()
    callbacks: list[Any] = [count]
    if arm != "none":
        callbacks.insert(0, FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: frozen}), cache=arm == "cache"))
    model = build("none", 0)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=BATCH,
            num_train_epochs=EPOCHS,
            learning_rate=5e-5,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=0,
            dataloader_num_workers=0,
            remove_unused_columns=False,
        )
        train = Docs(*data["train"], indexed=arm == "cache")
        Trainer(model=model, args=args, train_dataset=train, callbacks=callbacks).train()
    return count.by_epoch(EPOCHS)


def schedule_bounds(full: int, rows: dict[str, Any], schedule: dict[int, int], steps: int) -> dict[str, float]:
    """No freezing's operations over ``steps`` steps, over the same steps with each frozen step costing what a step
    at its frozen count costs without the cache, filled in the step, or served."""

    def total(cost: Any) -> int:
        frozen, ops = 0, 0
        for step in range(steps):
            frozen = schedule.get(step, frozen)
            ops += full if frozen == 0 else cost(rows[str(frozen)])
        return ops

    out = {
        "no_freezing": total(lambda row: full),
        "without_cache": total(lambda row: row["nocache"]["ops_last_epoch"]),
        "every_step_filled": total(lambda row: min(row["cache"]["ops_by_epoch"]["1"])),
        "every_step_served": total(lambda row: row["cache"]["ops_last_epoch"]),
    }
    return {**out, **{f"{k}_speedup": out["no_freezing"] / v for k, v in out.items() if k != "no_freezing"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-docs", type=int, default=64, help="training articles (default 64: 4 steps an epoch)")
    ap.add_argument("--seq", type=int, default=32, help="word pieces per article (the counts do not depend on it)")
    ap.add_argument("--schedule", default="24:1,36:2,84:3,168:5", help="STEP:FROZEN,... a run's freezes")
    ap.add_argument("--steps", type=int, default=200, help="the run's optimizer steps (default 200)")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    opts = ap.parse_args()
    import logging

    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(2)
    started = time.perf_counter()
    data = bbc(opts.seq, opts.max_docs)
    rows: dict[str, Any] = {}
    full = run("none", 0, data)
    baseline = min(full[str(EPOCHS - 1)])
    for frozen in range(1, BLOCKS):
        row: dict[str, Any] = {"frozen_blocks": frozen}
        for arm in ("nocache", "cache"):
            by_epoch = run(arm, frozen, data)
            row[arm] = {"ops_by_epoch": by_epoch, "ops_last_epoch": min(by_epoch[str(EPOCHS - 1)])}
            row[arm]["share_of_full_step"] = row[arm]["ops_last_epoch"] / baseline
        rows[str(frozen)] = row
        print(
            f"{frozen} of {BLOCKS} frozen: without the cache {row['nocache']['ops_last_epoch']} ops a step "
            f"({row['nocache']['share_of_full_step']:.0%}), served from it {row['cache']['ops_last_epoch']} "
            f"({row['cache']['share_of_full_step']:.0%}), filling {max(row['cache']['ops_by_epoch']['1'])} at most",
            file=sys.stderr,
        )
    schedule = {int(a): int(b) for a, b in (item.split(":") for item in opts.schedule.split(",") if item)}
    bounds = schedule_bounds(baseline, rows, schedule, opts.steps)
    print(
        f"the schedule {opts.schedule} over {opts.steps} steps: freezing alone {bounds['without_cache_speedup']:.2f}x "
        f"fewer operations, every frozen step filled {bounds['every_step_filled_speedup']:.2f}x, every frozen step "
        f"served {bounds['every_step_served_speedup']:.2f}x",
        file=sys.stderr,
    )
    report = {
        **provenance(),
        "benchmark": "hf_callback_ops",
        "command": " ".join(["python", *sys.argv]),
        "settings": {
            "model": "all-MiniLM-L6-v2 + 5-way head",
            "blocks": BLOCKS,
            "epochs": EPOCHS,
            "batch": BATCH,
            "max_docs": opts.max_docs,
            "seq": opts.seq,
            "freeze_after_epoch": 1,
        },
        "ops_full_step": baseline,
        "ops_by_epoch_full": full,
        "rows": rows,
        "schedule": {"freezes": schedule, "steps": opts.steps, **bounds},
        "job_seconds": time.perf_counter() - started,
    }
    print(f"a step without the callback: {baseline} ops", file=sys.stderr)
    emit(report, opts.out)


if __name__ == "__main__":
    main()
