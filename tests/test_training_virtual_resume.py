"""Checkpoints with several stages per rank (``[pipeline] virtual``, issue 43): one shard per stage, and exact
resumes with the same v, into v = 1 and back.

Two uninterrupted 2-rank runs (float64, CPU, gloo) write a checkpoint every 2 steps and after each epoch: one with
v = 2 stages per rank (the interleaved schedule, 4 stages: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3),
one with v = 1 (GPipe). A unit freezes after epoch 0, so a resume from inside epoch 0 goes through a transition and
one from epoch 1 starts with a frozen prefix. Each resume puts one checkpoint alone in a directory and continues
to the end bit-identical to the uninterrupted run: with the checkpoint's v, and with the other v too (the layout
re-cut to it, the weights and the optimizer state read by sub-layer from the shards; the issue asks 1e-10 there,
and float64 on CPU gives every bit: both schedules sum each gradient over the same micro-batches in one order).
A run stopped by ``max_steps`` and continued, a torchrun job whose rank holding stages 1 and 3 is killed, and a
``drift`` policy's probe outputs resumed into v = 1 (regrouped by rank) are checked the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from checkpoint_copy import copy_checkpoint
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.layout.rule import with_virtual
from elastic_pipe.orchestrator.persist.snapshot import regroup_probe
from elastic_pipe.testing import RankContext, run_distributed
from elastic_pipe.types import Layout

#: 160 digits: 4 steps of 32 an epoch (the rest is held out), 8 steps in 2 epochs.
SAMPLES = 160
#: The checkpoints resumed from: inside epoch 0 (before the freeze), after epoch 0 (after its transition), inside
#: epoch 1 (a frozen prefix).
STEP0, EPOCH1, STEP1 = "epoch-0000-step-000002", "epoch-0001", "epoch-0001-step-000002"
#: (uninterrupted run, checkpoint, v of the resume) for every resume the job makes.
RESUMES = [
    ("v2", STEP0, 2),
    ("v2", STEP1, 2),
    ("v2", STEP0, 1),
    ("v2", EPOCH1, 1),
    ("v2", STEP1, 1),
    ("v1", STEP0, 2),
    ("v1", EPOCH1, 2),
    ("v1", STEP1, 2),
]


def test_a_layout_takes_another_v_over_the_same_ranks_and_frozen_prefix() -> None:
    costs = [1.0] * 8

    def microbatches(k: int) -> int:
        return 3 * k

    one = Layout(3, 2, 1, (3, 6, 8), 2)
    two = with_virtual(one, 2, costs, solver="optimal", world_size=2, microbatches_for=microbatches)
    assert two == Layout(3, 2, 1, (3, 5, 6, 7, 8), 2, virtual=2)  # the micro-batches kept with the ranks
    assert with_virtual(two, 1, costs, solver="optimal", world_size=2, microbatches_for=microbatches) == Layout(
        3, 2, 1, (3, 6, 8), 2
    )
    assert with_virtual(one, 1, costs, solver="optimal", world_size=2, microbatches_for=microbatches) is one
    # 3 active sub-layers cannot fill 2 ranks x 2 stages: 1 rank holds both, 2 replicas (micro-batches for 1 rank)
    short = with_virtual(
        Layout(5, 2, 1, (5, 7, 8), 2), 2, costs, solver="optimal", world_size=2, microbatches_for=microbatches
    )
    assert short == Layout(5, 1, 2, (5, 7, 8), 3, virtual=2)
    last = Layout(7, 1, 2, (7, 8), 2)
    with pytest.raises(OrchestratorError, match="1 active sub-layer"):
        with_virtual(last, 2, costs, solver="optimal", world_size=2, microbatches_for=microbatches)


def test_probe_outputs_are_regrouped_by_the_ranks_of_the_new_layout() -> None:
    units = (2, 4, 6, 8)  # unit u ends after sub-layer 2u + 1
    h = {str(u): torch.full((2,), float(u)) for u in range(4)}
    # saved with v = 2 on 2 ranks: rank 0 held stages (0:2) and (4:6), rank 1 (2:4) and (6:8)
    saved = {"0": {"0": h["0"], "2": h["2"]}, "1": {"1": h["1"], "3": h["3"]}}
    regrouped = regroup_probe(saved, Layout(0, 2, 1, (0, 4, 8), 2), units)
    assert {p: sorted(piece) for p, piece in regrouped.items()} == {"0": ["0", "1"], "1": ["2", "3"]}
    assert regrouped["1"]["2"] is h["2"]  # the tensors themselves, not copies


def _config(directory: Path, virtual: int | str, changes: Mapping[str, object] | None = None) -> Any:
    """The 2-rank run checkpointing every 2 steps, with ``virtual`` stages per rank (the interleaved schedule when
    it may be more than 1) and then ``changes`` (``{"section.key": value}``) applied."""
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 2, "global_batch": 32, "optimizer": "adamw", "lr": 0.02},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 1}}},
        "pipeline": {
            "pipe_len": 2,
            "microbatches": 2,
            "solver": "optimal",
            "cache": "off",
            "compression": "none",
            "virtual": virtual,
            "schedule": "gpipe" if virtual == 1 else "interleaved",
        },
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
        "checkpoint": {"dir": str(directory), "steps": 2},
    }
    return config_from_tables(tables).override(changes or {})


def _fit(
    directory: Path, virtual: int | str, max_steps: int = 0, changes: Mapping[str, object] | None = None
) -> dict[str, Any]:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    samples = Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])
    config = _config(directory, virtual, {**(changes or {}), "train.max_steps": max_steps})
    with ElasticTrainer(config, data=samples, quiet=True) as trainer:
        result = trainer.fit()
        keys = trainer.ctx.sublayer_keys
    shapes = [(e["frozen_units"], e["pipe_len"]) for e in result.epochs]
    return {"losses": result.losses, "shapes": shapes, "eval": result.final_eval_loss, "keys": keys}


def _job(ctx: RankContext, tmp: str) -> dict[str, Any]:
    """The uninterrupted runs, a run stopped inside epoch 1 and continued, then every resume of :data:`RESUMES`, one
    after the other in one 2-rank job, each in its own directory."""

    root = Path(tmp)
    out = {name: _fit(root / name, v) for name, v in (("v2", 2), ("v1", 1))}
    out["stopped"] = _fit(root / "stopped", 2, max_steps=6)  # stops after step 2 of epoch 1, with a checkpoint
    out["continued"] = _fit(root / "stopped", 2)
    for source, name, v in RESUMES:
        target = root / f"{source}-{name}-v{v}"
        out[target.name] = _fit_resumed(ctx, root / source, name, target, v)
    return out


def _fit_resumed(
    ctx: RankContext,
    source: Path,
    checkpoint: str,
    target: Path,
    virtual: int | str,
    *,
    changes: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """Copy ``source``'s ``checkpoint`` into ``target`` (rank 0, every rank waiting) and continue it there with
    ``virtual`` stages per rank (:func:`_fit`)."""
    import torch.distributed as dist

    if ctx.rank == 0:
        copy_checkpoint(source, target, checkpoint)
    dist.barrier()
    return _fit(target, virtual, changes=changes)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("virtual-resume")
    out: dict[str, Any] = run_distributed(_job, 2, str(tmp), timeout=500)[0]
    return tmp, out


def _final_weights(directory: Path) -> dict[str, torch.Tensor]:
    from elastic_pipe.orchestrator.persist import load_weights

    meta = json.loads((directory / "latest.json").read_text())
    weights, state = load_weights(directory / meta["file"])
    assert state["run"]["epoch"] == 2
    return weights


def _launch(directory: Path, fault: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A v = 2 job under torchrun with one restart allowed (as ``elastic-pipe train`` runs it), on all the digits;
    ``fault``: where the fault hook kills a rank on the first attempt ("" for none)."""
    from elastic_pipe.orchestrator import launch
    from elastic_pipe.orchestrator.launch.faults import FAULT_ENV
    from elastic_pipe.orchestrator.worker import entry

    if fault:
        monkeypatch.setenv(FAULT_ENV, fault)
    tables = {
        "data.eval_fraction": 0.8,  # 5 steps of 64 an epoch
        "train.global_batch": 64,
        "launch.max_restarts": 1,
        "log.dir": str(directory / "log"),
    }
    config = _config(directory / "ckpt", 2).override(tables)
    results = launch(config, entry, config.to_dict())
    return dict(results[0])


def _load(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


@pytest.mark.distributed
def test_each_stage_of_a_rank_holding_two_writes_its_own_shard(job: tuple[Path, dict[str, Any]]) -> None:
    tmp, out = job
    keys: list[list[str]] = out["v2"]["keys"]
    directory = tmp / "v2"
    # (checkpoint, boundaries of its 4 stages): before the freeze, and after it (3 frozen sub-layers, on stage 0)
    for name, bounds in ((STEP0, (0, 2, 4, 6, 8)), (EPOCH1, (3, 4, 5, 6, 8)), (STEP1, (3, 4, 5, 6, 8))):
        shards = [f"{name}.stage-{s:04d}.shard" for s in range(4)]
        assert sorted(p.name for p in directory.glob(f"{name}.stage-*.shard")) == shards
        main = _load(directory / f"{name}.pt")
        assert "model" not in main and set(main["optimizer"]) == {"param_groups"}
        assert main["run"]["layout"]["virtual"] == 2 and main["run"]["layout"]["boundaries"] == list(bounds)
        assert main["shards"]["files"] == shards
        for s, shard in enumerate(shards):
            content = _load(directory / shard)
            sublayers = [*range(bounds[0] if s == 0 else 0), *range(bounds[s], bounds[s + 1])]
            mine = [k for j in sublayers for k in keys[j]]
            assert list(content["model"]) == mine  # its own stage's weights (and the frozen prefix on stage 0)
            assert content["optimizer"]["state"] and set(content["optimizer"]["state"]) <= set(mine)
            assert all(main["shards"]["index"][k] == shard for k in mine)
    # a v = 1 checkpoint keeps its record as before virtual stages: no "virtual" entry, one shard per rank
    main = _load(tmp / "v1" / f"{STEP0}.pt")
    assert "virtual" not in main["run"]["layout"] and len(main["shards"]["files"]) == 2


@pytest.mark.distributed
def test_runs_with_one_and_two_stages_per_rank_train_alike(job: tuple[Path, dict[str, Any]]) -> None:
    _, out = job
    assert out["v2"]["shapes"] == out["v1"]["shapes"] == [(0, 2), (1, 2)]
    assert out["v2"]["losses"] == out["v1"]["losses"]  # bit for bit: see the resumes below
    assert out["v2"]["losses"][-1] != pytest.approx(out["v2"]["losses"][0], rel=1e-3)  # training did something


@pytest.mark.distributed
def test_a_stopped_run_with_two_stages_per_rank_continues_exactly(job: tuple[Path, dict[str, Any]]) -> None:
    tmp, out = job
    assert len(out["stopped"]["losses"]) == 6
    assert out["continued"]["losses"] == out["v2"]["losses"]
    expected = _final_weights(tmp / "v2")
    weights = _final_weights(tmp / "stopped")
    assert list(weights) == list(expected)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


@pytest.mark.distributed
def test_a_killed_rank_holding_two_stages_costs_time_not_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 (stages 1 and 3) exits in step 3 of epoch 1; torchrun restarts both ranks, which resume from the
    checkpoint after step 2 of epoch 1 and end with the weights of the uninterrupted job, bit for bit."""
    clean = _launch(tmp_path / "clean", "", monkeypatch)
    killed = _launch(tmp_path / "killed", "step:1:1:3", monkeypatch)
    assert (tmp_path / "killed" / "ckpt" / "epoch-0001-step-000002.stage-0003.shard").exists()
    assert killed["losses"] == clean["losses"] and len(clean["losses"]) == 10
    expected = _final_weights(tmp_path / "clean" / "ckpt")
    weights = _final_weights(tmp_path / "killed" / "ckpt")
    assert list(weights) == list(expected) and all(torch.equal(weights[k], expected[k]) for k in expected)
    records = [json.loads(line) for line in (tmp_path / "killed" / "log" / "events.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "resume"] == [1]


@pytest.mark.distributed
@pytest.mark.parametrize(("source", "name", "virtual"), RESUMES)
def test_a_resume_with_either_v_ends_as_the_uninterrupted_run(
    source: str, name: str, virtual: int, job: tuple[Path, dict[str, Any]]
) -> None:
    tmp, out = job
    resumed, clean = out[f"{source}-{name}-v{virtual}"], out[source]
    expected = _final_weights(tmp / source)
    weights = _final_weights(tmp / f"{source}-{name}-v{virtual}")
    assert list(weights) == list(expected)
    assert resumed["shapes"] == clean["shapes"]
    # bit for bit, with the checkpoint's v and with the other (the issue asks 1e-10 for the other): each
    # parameter's gradient sums the same micro-batches in the same order under both schedules
    assert resumed["losses"] == clean["losses"]
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    assert resumed["eval"] == clean["eval"]


#: The drift job's step checkpoint: after step 1 of epoch 1 (step 5 of the run), strictly between the decision
#: points after steps 4 and 6.
DRIFT_CHECKPOINT = "epoch-0001-step-000001"


def _drift_fit(directory: Path, virtual: int) -> dict[str, Any]:
    """A run under a drift policy that records the probe's changes and never freezes (a threshold of 0), deciding
    every 2 steps and checkpointing after every step."""
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.data import Split
    from recording_drift import RecordingDrift

    d = load_digits()
    samples = Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])
    config = _config(directory, virtual).override({"freeze.decide_every": 2, "checkpoint.steps": 1})
    policy = RecordingDrift(3, threshold=0.0, patience=1, tolerance=None)
    with ElasticTrainer(config, data=samples, policy=policy, quiet=True) as trainer:
        result = trainer.fit()
    return {"seen": policy.seen, "losses": result.losses}


def _drift_job(ctx: RankContext, tmp: str) -> dict[str, Any]:
    """The uninterrupted v = 2 run, then its step checkpoint resumed with v = 2 and with v = 1."""
    import torch.distributed as dist

    root = Path(tmp)
    out = {"clean": _drift_fit(root / "clean", 2)}
    for v in (2, 1):
        if ctx.rank == 0:
            copy_checkpoint(root / "clean", root / f"v{v}", DRIFT_CHECKPOINT)
        dist.barrier()
        out[f"v{v}"] = _drift_fit(root / f"v{v}", v)
    return out


@pytest.mark.distributed
def test_the_probe_outputs_follow_the_stages_into_another_v(tmp_path: Path) -> None:
    """The kept probe outputs of 2 ranks x 2 stages, regrouped by the ranks of 2 ranks x 1 stage, are the baseline
    of the resumed run's next decision point: it measures the drift of the uninterrupted run (rank 0 decides and
    records them)."""
    out: dict[str, Any] = run_distributed(_drift_job, 2, str(tmp_path), timeout=300)[0]
    clean = out["clean"]
    assert len(clean["seen"]) == 3  # the decision points after steps 2, 4 and 6
    assert all(c > 0 for c in clean["seen"][2][:2])  # a change measured, not a unit seen first (inf)
    for v in (2, 1):
        assert out[f"v{v}"]["seen"] == clean["seen"][2:]  # the resumed policy saw the last decision only
        assert out[f"v{v}"]["losses"] == clean["losses"]
