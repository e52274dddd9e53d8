"""Plug your own freeze policy into elastic training: by object (Python API) and by import path (TOML / CLI).

    python examples/custom_policy_train.py        # two 4-process CPU runs, about a minute each

The policy below is an ordinary class - no base class, nothing registered - with every member of
``elastic_pipe.freeze.FreezePolicy``. Only ``num_layers`` and ``propose`` are required: subclass
``elastic_pipe.freeze.Policy`` for defaults of the others, or pass a function ``(epoch, step, current) -> int``
(docs/first_custom_run.md).

1. By object: every worker builds the policy and hands it to ``ElasticTrainer(config, policy=...)``.
2. By import path: the config says ``[freeze] policy = "custom_policy_train:FreezeWhileImproving"``; every worker
   that ``elastic-pipe train`` (or torchrun) starts imports it itself. The same config works from the command line:
   ``elastic-pipe train --config run.toml`` with this file in the current directory or beside run.toml (both are
   put on the workers' ``sys.path``), else with ``PYTHONPATH`` set.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, ClassVar

from elastic_pipe.freeze import LayerStats

TABLES: dict[str, Any] = {
    "model": {"name": "vit", "options": {"preset": "vit-tiny", "patch_size": 4}},
    "train": {"epochs": 4, "global_batch": 64, "optimizer": "adamw", "lr": 0.006},
    "pipeline": {"pipe_len": 4, "microbatches": 2},
    "launch": {"nproc_per_node": 4, "backend": "gloo"},
    "log": {"progress": False},
}


class FreezeWhileImproving:
    """Freezes one more leading block after every epoch whose held-out loss improved on the best so far."""

    name: ClassVar[str] = "freeze-while-improving"
    needs_stats: ClassVar[bool] = False  # decides from the held-out loss alone: no gradient statistics needed

    def __init__(self, num_layers: int, most: int = 4) -> None:
        self.num_layers = num_layers
        self.most = most
        self.best = math.inf
        self.improved = False

    def observe(self, stats: LayerStats) -> None:
        del stats  # never called with needs_stats False

    def observe_eval(self, loss: float) -> None:
        self.improved = loss < self.best
        self.best = min(self.best, loss)

    def propose(self, epoch: int, step: int, current: int) -> int:
        del epoch, step
        return min(current + 1, self.most, self.num_layers) if self.improved else current

    def state_dict(self) -> dict[str, Any]:
        return {"most": self.most, "best": self.best, "improved": self.improved}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.most, self.best, self.improved = int(state["most"]), float(state["best"]), bool(state["improved"])


def by_object(tables: dict[str, Any]) -> dict[str, Any]:
    """One worker: build the config, the policy object and the trainer; train."""
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    config = config_from_tables(tables)
    with ElasticTrainer(config, policy=FreezeWhileImproving(num_layers=6), quiet=True) as trainer:
        return trainer.fit().to_dict()


def _show(title: str, result: dict[str, Any]) -> None:
    print(title)
    for e in result["epochs"]:
        print(
            f"  epoch {e['epoch'] + 1}: frozen {e['frozen_units']}  K={e['pipe_len']} R={e['replicas']}  "
            f"eval loss {e['eval_loss']:.3f}"
        )


def main() -> None:
    from elastic_pipe.orchestrator import config_from_tables, launch, preflight
    from elastic_pipe.orchestrator.worker import entry

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the spawned workers inherit it
    config = config_from_tables(TABLES)
    _show("by object:", launch(config, by_object, TABLES)[0])

    by_path = {**TABLES, "freeze": {"policy": "custom_policy_train:FreezeWhileImproving", "options": {"most": 3}}}
    config = config_from_tables(by_path)
    preflight(config)  # imports the policy here too: a wrong path is one clear error before any process starts
    _show("by import path:", launch(config, entry, config.to_dict())[0])


if __name__ == "__main__":
    main()
