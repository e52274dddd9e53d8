"""Daily-use training options on 2 gloo processes: a grown run resumes into the decisions a longer run makes,
gradient clipping is global whatever the layout, ``max_steps`` and ``eval_every`` stop and skip as documented."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.testing import RankContext, run_distributed

#: A 320-sample slice of the digits: 256 training samples, 8 steps of 32 per epoch.
SAMPLES = 320
STEPS_PER_EPOCH = 8


def _tables(**sections: dict[str, Any]) -> dict[str, Any]:
    tables: dict[str, Any] = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
        "freeze": {"policy": "alpha", "options": {"alpha": 0.5}},
        "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": True},
    }
    for name, body in sections.items():
        tables[name] = {**tables.get(name, {}), **body}
    return tables


def _samples() -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])


def _runs(ctx: RankContext, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Train each config in turn; rank 0 reports the result, its stderr and the final weights."""
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    out = []
    for tables in runs:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), ElasticTrainer(config_from_tables(tables), data=_samples()) as trainer:
            result = trainer.fit().to_dict()
            weights = io.BytesIO()
            torch.save(trainer.full_state_dict(), weights)  # tensors in shared memory would not outlive the rank
        out.append({"result": result, "stderr": err.getvalue(), "weights": weights.getvalue()})
    return out


def _weights(run: dict[str, Any]) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(io.BytesIO(run["weights"]), weights_only=True)
    return loaded


def _shapes(result: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in result["epochs"]]


def _clipping_runs() -> list[dict[str, Any]]:
    common: dict[str, Any] = {"train": {"epochs": 1, "max_steps": 3, "momentum": 0.0, "lr": 0.5, "max_grad_norm": 0.05}}
    return [
        _tables(**common, freeze={"policy": "never", "options": {}}),  # 2 stages x 1 replica
        _tables(**common, freeze={"policy": "never", "options": {}}, pipeline={"pipe_len": 1}),  # 1 stage x 2
        _tables(
            train={"epochs": 1, "max_steps": 3, "momentum": 0.0, "lr": 0.5}, freeze={"policy": "never", "options": {}}
        ),
        _tables(train={"max_steps": 2 * STEPS_PER_EPOCH + 3}, log={"eval_every": 2, "progress": False}),
    ]


@pytest.fixture(scope="module")
def rank0_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The runs of both tests (the resume's 3, then the clipping's 4), one after the other in one 2-rank job (each
    test started its own: the ranks' start-up cost about as much as the runs); rank 0's reports, and the directory
    that holds the resume test's checkpoints. Timeout: the two jobs' 240 s each."""
    tmp_path = tmp_path_factory.mktemp("conveniences")
    ckpt = {"dir": str(tmp_path / "ckpt")}
    resume = [_tables(), _tables(train={"epochs": 2}, checkpoint=ckpt), _tables(checkpoint=ckpt)]
    return tmp_path, run_distributed(_runs, 2, resume + _clipping_runs(), timeout=480)[0]


@pytest.mark.distributed
@pytest.mark.slow  # > 20 s on 2 shared cores
def test_resume_with_more_epochs_makes_the_skipped_decision(rank0_runs: tuple[Path, list[dict[str, Any]]]) -> None:
    tmp_path, runs = rank0_runs
    fresh, short, grown = runs[:3]
    expected = _shapes(fresh["result"])
    assert expected[2] != expected[1], "the 3-epoch run must reshape before epoch 3 for this test to mean anything"
    assert _shapes(short["result"]) == expected[:2]
    assert _shapes(grown["result"]) == expected  # the history of the first two epochs, then the decided third
    assert [t["epoch"] for t in grown["result"]["transitions"]] == [t["epoch"] for t in fresh["result"]["transitions"]]
    assert f"resuming from epoch 3 step {2 * STEPS_PER_EPOCH} ({tmp_path / 'ckpt' / 'epoch-0002.pt'})" in (
        grown["stderr"].splitlines()
    )
    # stderr is not a terminal here: progress comes as plain lines, never carriage returns
    assert "\r" not in fresh["stderr"] and "epoch 1/3 100% 8/8 " in fresh["stderr"]
    assert grown["result"]["losses"] == pytest.approx(fresh["result"]["losses"], rel=1e-10)
    for name, tensor in _weights(fresh).items():
        torch.testing.assert_close(_weights(grown)[name], tensor, rtol=1e-9, atol=1e-12)


@pytest.mark.distributed
@pytest.mark.slow  # > 20 s on 2 shared cores
def test_clipping_is_global_and_max_steps_eval_every(rank0_runs: tuple[Path, list[dict[str, Any]]]) -> None:
    two_stages, one_stage, unclipped, stopped = rank0_runs[1][3:]
    assert len(two_stages["result"]["losses"]) == 3  # max_steps stopped the epoch after 3 of its 8 steps
    assert two_stages["result"]["epochs"][0]["steps"] == 3
    clipped = _weights(two_stages)
    for name, tensor in clipped.items():
        torch.testing.assert_close(_weights(one_stage)[name], tensor, rtol=1e-10, atol=1e-12)
    moved = [n for n, t in clipped.items() if not torch.allclose(_weights(unclipped)[n], t)]
    assert moved, "clipping at 0.05 changed nothing: the test's norm is not small enough"
    # eval_every = 2: epoch 1 is not evaluated, epoch 2 is, and the run's end (3 steps into epoch 3) always
    epochs = stopped["result"]["epochs"]
    assert [e["steps"] for e in epochs] == [STEPS_PER_EPOCH, STEPS_PER_EPOCH, 3]
    assert [e["eval_loss"] is None for e in epochs] == [True, False, False]
    assert stopped["result"]["final_eval_loss"] == epochs[2]["eval_loss"]
    assert "epoch 1/3 loss " in stopped["stderr"] and " eval - " in stopped["stderr"]
