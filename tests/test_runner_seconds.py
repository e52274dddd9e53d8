"""An epoch's record counts the compile and capture seconds of every runner that stepped in it, also those a
transition inside the epoch replaced, and each transition's phases get what its own layout's first steps paid."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

from plug_data import Digits

#: What each runner "compiles" on its first step (a stand-in for torch's measure, which needs a compiler).
FIRST_STEP_S = 1.5


def _config() -> object:
    from elastic_pipe.orchestrator import config_from_tables

    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True},
            "train": {"epochs": 4, "global_batch": 16, "optimizer": "sgd", "lr": 0.05},
            # a decision point every 3 steps of 6: transitions at an epoch's start and inside an epoch
            "freeze": {"policy": "freezeout", "decide_every": 3},
            "pipeline": {"pipe_len": 1, "microbatches": 1},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )


def test_a_runner_replaced_inside_an_epoch_keeps_its_compile_seconds_in_the_record(
    one_rank_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.stage import local_step

    stepped: list[int] = []  # the runners that stepped, in order, by id
    original = local_step.LocalStep.step

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if id(self) not in stepped:
            stepped.append(id(self))
            self.compile_s += FIRST_STEP_S
        return original(self, *args, **kwargs)

    monkeypatch.setattr(local_step.LocalStep, "step", step)
    torch.manual_seed(0)
    with ElasticTrainer(_config(), data=Digits(96), quiet=True) as trainer:
        result = trainer.fit()
    inside = [t for t in result.transitions if t["epoch_step"] > 0]
    assert inside, "the run needs a transition inside an epoch"
    # every runner's first step is in some epoch's record, once
    assert sum(e["compile_s"] for e in result.epochs) == pytest.approx(FIRST_STEP_S * len(stepped))
    for epoch in result.epochs:  # the runners that first stepped in it: the run's first, then each transition's
        runners = (epoch["epoch"] == 0) + sum(1 for t in result.transitions if t["epoch"] == epoch["epoch"])
        assert epoch["compile_s"] == pytest.approx(FIRST_STEP_S * runners), epoch
    # each transition is credited with its own layout's first step, none twice (the last one's layout stepped)
    assert [t["phases"]["compile"] for t in result.transitions] == [FIRST_STEP_S] * len(result.transitions)
