"""Reshaping does not change the mathematics: an elastic run and the same run without reshaping give the same losses.

Both runs: the same seed, data order, global batch, learning-rate schedule and freeze decisions (a manual schedule),
float64 on CPU. The elastic run compresses the pipeline 2 -> 1 and doubles the replicas at epoch 2, and reads the
frozen prefix from the activation cache; the other keeps 2 stages and 1 replica and recomputes the prefix.
Only the order of floating-point sums differs (micro-batches, all-reduce), so the per-step
losses agree to ~1e-12.
"""

from __future__ import annotations

from typing import Any

import pytest

import tiny_vit
from elastic_pipe.testing import RankContext, run_distributed

#: Runs on a 320-sample slice of the digits so that 3 epochs take a few seconds.
SAMPLES = 320


def _config(**pipeline: Any) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
        "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", "compression": "halving", **pipeline},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }
    return config_from_tables(tables)


def _samples() -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])


def _both_runs(ctx: RankContext) -> dict[str, Any]:
    from elastic_pipe.orchestrator import run_rank

    samples = _samples()
    elastic = run_rank(_config(cache="on"), samples=samples, quiet=True).to_dict()
    fixed = run_rank(_config(compression="none", cache="off"), samples=samples, quiet=True).to_dict()
    return {"elastic": elastic, "fixed": fixed}


@pytest.mark.distributed
def test_equivalence_of_elastic_and_fixed_runs() -> None:
    results = run_distributed(_both_runs, 2, timeout=180)
    elastic, fixed = results[0]["elastic"], results[0]["fixed"]
    # The elastic run really reshaped: 2 stages x 1 replica, then (2 frozen units) 1 stage x 2 replicas.
    shapes = [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in elastic["epochs"]]
    assert shapes == [(0, 2, 1), (1, 2, 1), (2, 1, 2)]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in fixed["epochs"]] == [
        (0, 2, 1),
        (1, 2, 1),
        (2, 2, 1),
    ]
    # the elastic run served the frozen prefix from the activation cache, the fixed one recomputed it
    assert [e["cache"] for e in elastic["epochs"]] == [False, True, True]
    assert [e["cache"] for e in fixed["epochs"]] == [False, False, False]
    assert len(elastic["losses"]) == len(fixed["losses"]) == 3 * (SAMPLES - SAMPLES // 5) // 32
    assert elastic["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert elastic["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    # every rank reports the same numbers
    assert results[1]["elastic"]["losses"] == elastic["losses"]
    # and training did something: the loss moved
    assert elastic["losses"][-1] != pytest.approx(elastic["losses"][0], rel=1e-3)


def _midepoch_config(**pipeline: Any) -> Any:
    """Decisions every 3 steps (8 steps an epoch: none at an epoch's end); FreezeOut over 30 steps freezes unit 0 at
    step 13.5 and unit 1 at step 19, so the transitions happen after step 15 (epoch 1) and step 21 (epoch 2)."""
    return _config(**pipeline).override(
        {"freeze.policy": "freezeout", "freeze.options": {"t0": 0.5, "total_steps": 30}, "freeze.decide_every": 3}
    )


def _both_midepoch_runs(ctx: RankContext) -> dict[str, Any]:
    from elastic_pipe.orchestrator import run_rank

    samples = _samples()
    elastic = run_rank(_midepoch_config(cache="on"), samples=samples, quiet=True).to_dict()
    fixed = run_rank(_midepoch_config(compression="none", cache="off"), samples=samples, quiet=True).to_dict()
    return {"elastic": elastic, "fixed": fixed}


@pytest.mark.distributed
def test_equivalence_with_transitions_inside_epochs() -> None:
    results = run_distributed(_both_midepoch_runs, 2, timeout=180)
    elastic, fixed = results[0]["elastic"], results[0]["fixed"]
    # both transitions happened inside an epoch: freezing 1 unit after step 7 of epoch 1, then 2 units (and the
    # reshaping 2 stages x 1 replica -> 1 stage x 2 replicas, the sampler re-sharded) after step 5 of epoch 2
    where = [(t["epoch"], t["epoch_step"], t["step"], t["frozen_units"], t["pipe_len"]) for t in elastic["transitions"]]
    assert where == [(1, 7, 15, 1, 2), (2, 5, 21, 2, 1)]
    assert [(t["epoch"], t["epoch_step"], t["frozen_units"]) for t in fixed["transitions"]] == [(1, 7, 1), (2, 5, 2)]
    # epoch records describe the layout of the epoch's last step
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in elastic["epochs"]] == [
        (0, 2, 1),
        (1, 2, 1),
        (2, 1, 2),
    ]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in fixed["epochs"]] == [
        (0, 2, 1),
        (1, 2, 1),
        (2, 2, 1),
    ]
    assert [e["cache"] for e in elastic["epochs"]] == [False, True, True]
    assert [e["steps"] for e in elastic["epochs"]] == [8, 8, 8]
    assert len(elastic["losses"]) == len(fixed["losses"]) == 24
    assert elastic["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert elastic["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert results[1]["elastic"]["losses"] == elastic["losses"]
    # the epoch losses are the means of their steps' losses, whatever layout each step ran in
    for e, epoch in enumerate(elastic["epochs"]):
        assert epoch["loss"] == pytest.approx(sum(elastic["losses"][8 * e : 8 * e + 8]) / 8, rel=1e-12)
    assert elastic["losses"][-1] != pytest.approx(elastic["losses"][0], rel=1e-3)
