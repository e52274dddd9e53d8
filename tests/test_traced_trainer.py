"""benchmarks/gpu/_traced_trainer.py: a run whose transitions are watched by ``torch.profiler`` (what
``profile_transitions.py --trace`` and ``time_to_accuracy.py --trace-transitions`` print) keeps one operator table per
transition, at an epoch's start and inside an epoch alike, and trains as the plain trainer does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import tiny_vit
from script_module import load_script

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

from plug_data import Digits


def _config() -> object:
    from elastic_pipe.orchestrator import config_from_tables

    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True},
            "train": {"dtype": "float64", "epochs": 4, "global_batch": 16, "optimizer": "sgd", "lr": 0.05},
            # FreezeOut with a decision point every 3 steps: one freeze at an epoch's start, one inside an epoch
            # (a transition there runs with the trainer's ``before``, which pauses the epoch's clock)
            "freeze": {"policy": "freezeout", "decide_every": 3},
            "pipeline": {"pipe_len": 1, "microbatches": 1},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )


def test_every_transition_gets_its_operator_table_and_the_run_trains_as_without_the_profiler(
    one_rank_here: None,
) -> None:
    from elastic_pipe.orchestrator import ElasticTrainer

    tool = load_script(Path("benchmarks/gpu/_traced_trainer.py"))
    torch.manual_seed(0)
    with ElasticTrainer(_config(), data=Digits(96), quiet=True) as plain:
        expected = plain.fit()
    torch.manual_seed(0)
    with tool.TracedTrainer(_config(), data=Digits(96), quiet=True) as traced:
        result = traced.fit()
        traces = traced.traces
    assert sorted(t["epoch_step"] > 0 for t in result.transitions) == [False, True]  # at a start and inside
    assert [seconds for seconds, _ in traces] == [t["seconds"] for t in result.transitions]  # one per transition
    assert all("Self CPU" in text and "Name" in text for _, text in traces)  # the profiler's operator table
    assert result.losses == expected.losses  # watching changes no number the run computes
    printed = tool.slowest(traces, 1)
    assert printed.count("--- transition of") == 1
    assert f"{max(s for s, _ in traces):.3f} s" in printed.splitlines()[0]  # the slowest first


def test_slowest_orders_by_seconds_and_keeps_n() -> None:
    tool = load_script(Path("benchmarks/gpu/_traced_trainer.py"))
    printed = tool.slowest([(0.1, "a"), (0.3, "c"), (0.2, "b")], 2)
    assert printed == "--- transition of 0.300 s: top operators\nc\n--- transition of 0.200 s: top operators\nb"
    assert tool.slowest([(0.1, "a")], 0) == ""


@pytest.mark.parametrize("script", ["benchmarks/gpu/profile_transitions.py", "benchmarks/time_to_accuracy.py"])
def test_both_scripts_use_the_one_traced_trainer(script: str) -> None:
    text = Path(script).read_text()
    assert "from _traced_trainer import TracedTrainer, slowest" in text
    assert "class TracedTrainer" not in text
