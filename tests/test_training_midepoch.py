"""Decision points every N optimizer steps (``[freeze] decide_every``), transitions applied inside an epoch.

The equivalence of an elastic run with mid-epoch transitions and the fixed run with the same freeze timeline lives
in ``test_training_equivalence.py``; here: where decision points fall, the config, what the plan predicts, that an
epoch with a mid-epoch re-shard trains on every sample exactly once, that a run stopped at a decision point and
resumed decides first and ends as an uninterrupted run, that a rank killed after a checkpoint at a mid-epoch
decision point costs nothing, and the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.orchestrator.launch.faults import FAULT_ENV
from elastic_pipe.testing import RankContext, run_distributed, run_tasks

MODEL = dict(tiny_vit.OPTIONS)
#: 320 digits: 256 training samples, 8 steps of 32 an epoch.
SAMPLES = 320


def _tables(**changes: Any) -> dict[str, Any]:
    tables: dict[str, Any] = {
        "model": {"name": "vit", "options": MODEL},
        "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
        # FreezeOut over 30 steps (3 units): unit 0 stops at step 15, unit 1 at 20, unit 2 at 25
        "freeze": {"policy": "freezeout", "options": {"t0": 0.5, "total_steps": 30}, "decide_every": 3},
        "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }
    for key, value in changes.items():
        section, name = key.split(".", 1)
        tables.setdefault(section, {})[name] = value
    return tables


def _config(**changes: Any) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    return config_from_tables(_tables(**changes))


def _samples(n: int = SAMPLES) -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:n], d.labels[:n], d.sample_ids[:n])


# ------------------------------------------------------------------------------------------------- pure parts
def test_decision_points_fall_on_multiples_of_decide_every() -> None:
    from elastic_pipe.orchestrator.step_ops import decision_point

    assert [s for s in range(13) if decision_point(s, 4)] == [4, 8, 12]
    assert [s for s in range(13) if decision_point(s, 1)] == list(range(1, 13))
    assert not any(decision_point(s, 0) for s in range(13))  # 0: epoch ends only, which the trainer decides


@pytest.mark.parametrize("bad", [-1, 2.5, "3", "Auto", True, None])
def test_decide_every_must_be_a_nonnegative_integer_or_auto(bad: object) -> None:
    from elastic_pipe.orchestrator import ConfigError, config_from_tables

    with pytest.raises(ConfigError, match=rf"freeze.decide_every must be an integer >= 0 or 'auto', got {bad!r}"):
        config_from_tables({"model": {"name": "vit"}, "freeze": {"decide_every": bad}})
    assert config_from_tables({"model": {"name": "vit"}}).freeze.decide_every == "auto"
    assert config_from_tables({"model": {"name": "vit"}, "freeze": {"decide_every": 5}}).freeze.decide_every == 5


def test_auto_takes_the_policys_rhythm() -> None:
    """``"auto"`` (the default) resolves once the policy and the data are built: ``steps_per_epoch // 4`` under
    ``drift`` (the default policy, ``decisions_per_epoch = 4``), after every epoch under a policy without the
    attribute; an integer stays as given. Until resolved, ``every_steps`` refuses to guess."""
    from elastic_pipe import freeze
    from elastic_pipe.orchestrator import ConfigError, config_from_tables
    from elastic_pipe.orchestrator.components import decision_interval, epoch_steps, with_decisions

    config = config_from_tables({k: v for k, v in _tables().items() if k != "freeze"})
    assert (config.freeze.policy, config.freeze.decide_every) == ("drift", "auto")
    per_epoch = epoch_steps(config, SAMPLES)
    assert per_epoch == 8  # 256 training samples, batch 32
    drift = freeze.make_policy("drift", 3, total_steps=24)
    assert decision_interval(config, drift, SAMPLES) == 2
    resolved = with_decisions(config, drift, SAMPLES)
    assert resolved.freeze.decide_every == resolved.freeze.every_steps == 2 and resolved.train == config.train
    assert decision_interval(config, freeze.make_policy("alpha", 3, alpha=0.5), SAMPLES) == 0
    assert with_decisions(config.override({"freeze.decide_every": 3}), drift, SAMPLES).freeze.every_steps == 3
    with pytest.raises(ConfigError, match="'auto' is the policy's rhythm"):
        _ = config.freeze.every_steps


def test_cli_refuses_a_negative_decide_every_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from elastic_pipe.cli import main

    path = tmp_path / "run.toml"
    path.write_text('[model]\nname = "vit"\n', encoding="utf-8")
    assert main(["train", "--config", str(path), "--set", "freeze.decide_every=-1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("elastic-pipe train: error: ")
    assert "freeze.decide_every must be an integer >= 0 or 'auto', got -1" in captured.err


def test_run_state_keeps_decision_due() -> None:
    from elastic_pipe.orchestrator.state import RunState
    from elastic_pipe.types import Layout

    state = RunState(Layout(2, 2, 1, (2, 5, 8), 2), 4.0, frozen_units=1, epoch=1, step=9, decision_due=True)
    assert RunState.from_dict(state.to_dict(), 2) == state
    old = {k: v for k, v in state.to_dict().items() if k != "decision_due"}  # a checkpoint from before the field
    assert RunState.from_dict(old, 2) == state.replace(decision_due=False)


def test_a_transition_inside_an_epoch_says_where() -> None:
    from elastic_pipe.cli.train import render
    from elastic_pipe.orchestrator.report import TransitionEvent

    event = TransitionEvent(2, 21, 2, 5, 1, 2, 1, (5, 8), (1,), 1000, True, 0.5, epoch_step=5)
    assert event.human().startswith("transition in epoch 3 after step 5 (step 21 of the run): frozen 2 units")
    assert event.to_dict()["epoch_step"] == 5
    boundary = TransitionEvent(2, 16, 2, 5, 1, 2, 1, (5, 8), (1,), 1000, True, 0.5)
    assert boundary.human().startswith("transition before epoch 3: frozen 2 units")
    result = {
        "epochs": [],
        "transitions": [event.to_dict(), boundary.to_dict()],
        "final_accuracy": None,
        "final_eval_loss": 0.5,
        "seconds": 1.0,
    }
    lines = render(result).splitlines()
    assert lines[1].startswith("transition in epoch 3 after step 5: frozen 2 units")
    assert lines[2].startswith("transition before epoch 3: frozen 2 units")


def test_plan_lists_the_decision_points() -> None:
    from elastic_pipe.orchestrator.dry_run import planned_decisions, planned_epochs

    # The digits: 1797 samples, 1438 for training: 44 steps of 32 an epoch (the rest dropped), 88 steps in 2 epochs.
    # FreezeOut over 100 steps stops unit 0 at step 50, unit 1 at 66.7, unit 2 at 83.3; decide_every = 20 puts the
    # decision points at steps 20, 40, 60, 80 (epochs 0, 0, 1, 1 after 20, 40, 16, 36 of their steps).
    config = _config(
        **{"train.epochs": 2, "freeze.options": {"t0": 0.5, "total_steps": 100}, "freeze.decide_every": 20}
    )
    decisions = planned_decisions(config)
    assert [(d["step"], d["epoch"], d["epoch_step"], d["frozen_units"], d["changed"]) for d in decisions] == [
        (20, 0, 20, 0, False),
        (40, 0, 40, 0, False),
        (60, 1, 16, 1, True),
        (80, 1, 36, 2, True),
    ]
    assert (decisions[-1]["pipe_len"], decisions[-1]["replicas"]) == (1, 2)  # 2 frozen units: compressed to 1 stage
    epochs = planned_epochs(config)
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in epochs] == [(0, 2, 1), (2, 1, 2)]
    assert epochs[1]["boundaries"] == decisions[-1]["boundaries"]
    # without decide_every nothing changes: one decision point before epoch 1 (FreezeOut at step 44: nothing)
    config = config.override({"freeze.decide_every": 0})
    assert planned_decisions(config) == []
    assert [e["frozen_units"] for e in planned_epochs(config)] == [0, 0]


# ------------------------------------------------------------------------------------------------- distributed
def _record_ids(ctx: RankContext) -> dict[str, Any]:
    """One epoch, drop_last false, with the reshaping 2 stages x 1 replica -> 1 stage x 2 replicas after step 4;
    every stage-0 rank records the sample ids of each step it runs."""
    from elastic_pipe.orchestrator import run_rank
    from elastic_pipe.orchestrator.prefix import FrozenPrefix

    seen: list[list[int]] = []
    original = FrozenPrefix.forward

    def recording(self: FrozenPrefix, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        seen.append([int(i) for i in ids])
        return original(self, x, ids)

    FrozenPrefix.forward = recording  # type: ignore[method-assign]
    # 255 training samples, 48 a step: 5 full steps and a short one of 14 (the split unit is 2), 1 dropped; FreezeOut
    # over 6 steps stops units 0 and 1 at steps 3 and 4, so the decision point after step 4 freezes both
    config = _config(
        **{
            "data.eval_fraction": 0.2,
            "data.drop_last": False,
            "train.epochs": 1,
            "train.global_batch": 48,
            "freeze.options": {"t0": 0.5, "total_steps": 6},
            "freeze.decide_every": 2,
        }
    )
    try:
        result = run_rank(config, samples=_samples(319), quiet=True).to_dict()
    finally:
        FrozenPrefix.forward = original  # type: ignore[method-assign]
    return {"seen": seen, "result": result}


def _default_rhythm(ctx: RankContext) -> dict[str, Any]:
    """The config without a [freeze] table: the default policy (drift) at its own rhythm (decide_every "auto")."""
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.step_loop import EpochRun

    tables = {k: v for k, v in _tables(**{"train.epochs": 4, "train.lr_schedule": "cosine"}).items() if k != "freeze"}
    reads: list[int] = []  # the step a loader iteration of the training batches starts at
    original = EpochRun._read_from

    def counted(self: EpochRun, step: int, stage: Any) -> Any:
        reads.append(step)
        return original(self, step, stage)

    EpochRun._read_from = counted  # type: ignore[method-assign]
    try:
        with ElasticTrainer(config_from_tables(tables), data=_samples(), quiet=True) as t:
            every = t.config.freeze.decide_every
            result = t.fit().to_dict()
    finally:
        EpochRun._read_from = original  # type: ignore[method-assign]
    return {"every": every, "transitions": result["transitions"], "reads": reads}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The 2-rank tests' work, one after the other in one job (starting the ranks costs about as much as a run):
    ``_record_ids`` (which puts back what it patches), then ``_stop_at_a_decision_point_and_resume``."""
    tmp = str(tmp_path_factory.mktemp("decide"))
    tasks = {
        "record_ids": (_record_ids, ()),
        "stop_and_resume": (_stop_at_a_decision_point_and_resume, (tmp,)),
        "default_rhythm": (_default_rhythm, ()),
    }
    # the two jobs had 180 s and 300 s: the job gets their sum, and a minute for the third
    return run_distributed(run_tasks, 2, tasks, timeout=540)


@pytest.mark.distributed
@pytest.mark.slow  # > 20 s on 2 shared cores
def test_every_sample_once_in_an_epoch_with_a_mid_epoch_reshard(two_ranks: list[dict[str, Any]]) -> None:
    results = [r["record_ids"] for r in two_ranks]
    result = results[0]["result"]
    assert [(t["epoch_step"], t["frozen_units"], t["pipe_len"], t["replicas"]) for t in result["transitions"]] == [
        (4, 2, 1, 2)
    ]
    (epoch,) = result["epochs"]
    assert (epoch["steps"], epoch["dropped"], epoch["samples"]) == (6, 1, 254)
    rank0, rank1 = results[0]["seen"], results[1]["seen"]
    # before the reshaping rank 0 alone ran stage 0 (48 samples a step); after it both ranks did, 24 (7) each
    assert [len(s) for s in rank0] == [48, 48, 48, 48, 24, 7]
    assert [len(s) for s in rank1] == [24, 7]
    ids = [i for steps in (rank0, rank1) for s in steps for i in s]
    assert len(ids) == len(set(ids)) == 254  # every sample used at most once, all but the one dropped
    # and they are the training part's ids: the held-out ones never appear
    held_out = set(range(319)) - set(ids)
    assert len(held_out) == 64 + 1  # eval_count(319, 0.2) = 64, plus the dropped one


def _stop_at_a_decision_point_and_resume(ctx: RankContext, tmp: str) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    samples = _samples()
    out: dict[str, Any] = {}
    for name, changes in (
        ("clean", {}),
        ("stopped", {"train.max_steps": 15, "checkpoint.dir": str(Path(tmp) / "ckpt")}),
        ("resumed", {"checkpoint.dir": str(Path(tmp) / "ckpt")}),
    ):
        with ElasticTrainer(config_from_tables(_tables(**changes)), data=samples, quiet=True) as trainer:
            result = trainer.fit().to_dict()
            weights = trainer.full_state_dict()
            out[name] = {"result": result, "due": trainer.state.decision_due, "weights": weights}
    clean, resumed = out["clean"].pop("weights"), out["resumed"].pop("weights")
    del out["stopped"]["weights"]
    # tensors do not travel back from the spawned ranks: compare here (rank 0 holds the weights, the others none)
    out["names"] = list(clean) == list(resumed)
    out["different"] = [k for k, v in clean.items() if not torch.equal(resumed[k], v)]
    out["count"] = len(clean)
    return out


@pytest.mark.distributed
@pytest.mark.slow  # three runs in a row
def test_a_run_stopped_at_a_decision_point_decides_first_when_resumed(two_ranks: list[dict[str, Any]]) -> None:
    results = [r["stop_and_resume"] for r in two_ranks]
    out = results[0]
    clean, stopped, resumed = out["clean"], out["stopped"], out["resumed"]
    # max_steps = 15 stops right at the decision point that freezes unit 0: it is left for the resumed run
    assert stopped["due"] and not stopped["result"]["transitions"]
    assert len(stopped["result"]["losses"]) == 15
    # both end at the run's last step, a multiple of decide_every: the decision point a longer run would make
    assert clean["due"] and resumed["due"]
    where = [(t["epoch"], t["epoch_step"], t["step"]) for t in resumed["result"]["transitions"]]
    assert where == [(t["epoch"], t["epoch_step"], t["step"]) for t in clean["result"]["transitions"]]
    assert where == [(1, 7, 15), (2, 5, 21)]
    assert resumed["result"]["losses"] == clean["result"]["losses"]
    assert out["names"] and out["count"] > 0
    assert out["different"] == []


# ------------------------------------------------------------------------------------------------- torchrun
def _launch_config(tmp: Path, name: str) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    # 359 training samples, 5 steps of 64 an epoch, 15 in all; decisions after steps 3, 6, 9, 12 (none at an epoch's
    # end); FreezeOut over 15 steps stops unit 0 at 7.5 and unit 1 at 10: transitions after steps 9 (epoch 1 step
    # 4) and 12 (epoch 2 step 2), where the checkpoints every 2 steps of an epoch land too
    tables = _tables(
        **{
            "model.options": {**MODEL, "patch_size": 4},
            "data.eval_fraction": 0.8,
            "train.global_batch": 64,
            "train.optimizer": "adamw",
            "train.lr": 0.005,
            "freeze.options": {"t0": 0.5, "total_steps": 15},
            "launch.max_restarts": 1,
            "log.dir": str(tmp / name / "log"),
            "checkpoint.dir": str(tmp / name / "ckpt"),
            "checkpoint.steps": 2,
        }
    )
    return config_from_tables(tables)


def _launch(config: Any) -> dict[str, Any]:
    from elastic_pipe.orchestrator import launch
    from elastic_pipe.orchestrator.worker import entry

    return dict(launch(config, entry, config.to_dict())[0])


def _final_weights(config: Any) -> dict[str, torch.Tensor]:
    from elastic_pipe.orchestrator.persist import load_weights

    meta = json.loads((Path(config.checkpoint.dir) / "latest.json").read_text())
    weights, state = load_weights(Path(config.checkpoint.dir) / meta["file"])  # the main file and its shards
    assert state["run"]["epoch"] == config.train.epochs
    return weights


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("midepoch")
    config = _launch_config(tmp, "clean")
    return tmp, config, _launch(config)


@pytest.mark.distributed
@pytest.mark.slow  # torchrun jobs with a restart
@pytest.mark.parametrize(
    ("fault", "resumed_at"),
    [
        # rank 1 dies as step 4 of epoch 1 starts: after the transition at the decision point and the checkpoint
        # after it, which the restart resumes from (epoch 2 counted from 1, after step 9 of the run)
        ("step:1:1:4", "resuming from epoch 2 step 9 "),
        # rank 1 dies inside that transition: the restart resumes from the checkpoint two steps before and redoes
        # the steps and the transition
        ("transition:1:1:4", "resuming from epoch 2 step 7 "),
    ],
)
def test_a_rank_killed_at_a_mid_epoch_decision_point_costs_nothing(
    fault: str,
    resumed_at: str,
    clean_run: tuple[Path, Any, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    tmp, clean_config, clean = clean_run
    assert [(t["epoch"], t["epoch_step"], t["frozen_units"]) for t in clean["transitions"]] == [(1, 4, 1), (2, 2, 2)]
    monkeypatch.setenv(FAULT_ENV, fault)
    config = _launch_config(tmp, fault.replace(":", "-"))
    result = _launch(config)
    assert resumed_at in capfd.readouterr().err  # the fault struck and the restart resumed where expected
    checkpoint = torch.load(
        Path(config.checkpoint.dir) / "epoch-0001-step-000004.pt", map_location="cpu", weights_only=True
    )
    assert checkpoint["run"]["frozen_units"] == 1 and not checkpoint["run"]["decision_due"]  # the new layout's
    assert result["losses"] == clean["losses"]
    untimed = [{k: v for k, v in t.items() if k not in ("seconds", "phases")} for t in clean["transitions"]]
    assert [{k: v for k, v in t.items() if k not in ("seconds", "phases")} for t in result["transitions"]] == untimed
    expected, weights = _final_weights(clean_config), _final_weights(config)
    assert list(weights) == list(expected)
    assert all(torch.equal(weights[k], v) for k, v in expected.items())
    records = [json.loads(line) for line in (Path(config.log.dir) / "events.jsonl").read_text().splitlines()]
    # the killed attempt logged epoch 0 and the first transition; the restart continued from the checkpoint
    kinds = [(r["kind"], r["epoch"]) for r in records]
    assert kinds.count(("resume", 1)) == 1  # where the restart continued, once
    assert [k for k in kinds if k[0] != "resume"] == [
        ("epoch", 0),
        ("transition", 1),
        ("epoch", 1),
        ("transition", 2),
        ("epoch", 2),
    ]


@pytest.mark.distributed
@pytest.mark.slow  # spawns torchrun twice through the CLI
def test_cli_train_with_decide_every_runs_what_plan_predicts(tmp_path: Path) -> None:
    text = """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }
[data]
eval_fraction = 0.8
[train]
epochs = 2
global_batch = 64
[freeze]
policy = "freezeout"
options = { t0 = 0.5, total_steps = 10 }
[pipeline]
pipe_len = 2
microbatches = 2
solver = "optimal"
cache = "off"
[launch]
nproc_per_node = 2
backend = "gloo"
[log]
progress = false
"""
    path, planned_path = tmp_path / "run.toml", tmp_path / "planned.toml"
    path.write_text(text, encoding="utf-8")
    # plan has no --set: its copy of the file says it
    planned_path.write_text(text.replace("[pipeline]", "decide_every = 2\n[pipeline]"), encoding="utf-8")

    def cli(*args: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "elastic_pipe", *args, "--json"],
            capture_output=True,
            text=True,
            env=dict(os.environ),
            cwd=tmp_path,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    planned = cli("plan", "--config", str(planned_path))
    trained = cli("train", "--config", str(path), "--set", "freeze.decide_every=2")
    # 5 steps an epoch, decisions after steps 2, 4, 6, 8: FreezeOut stops unit 0 at 5 and unit 1 at 6.7, so the
    # transitions happen inside epoch 1, after its steps 1 and 3
    changed = [
        (d["epoch"], d["epoch_step"], d["frozen_units"], d["pipe_len"]) for d in planned["decisions"] if d["changed"]
    ]
    assert changed == [(1, 1, 1, 2), (1, 3, 2, 1)]
    assert [(t["epoch"], t["epoch_step"], t["frozen_units"], t["pipe_len"]) for t in trained["transitions"]] == changed
    ran = [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in trained["epochs"]]
    assert ran == [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in planned["epochs"]]
    assert ran == [(0, 2, 1), (2, 1, 2)]


@pytest.mark.distributed
@pytest.mark.slow
def test_the_default_policy_decides_four_times_an_epoch_and_freezes_up_to_its_cap(
    two_ranks: list[dict[str, Any]],
) -> None:
    # 8 steps an epoch, 4 epochs: a decision point every 2 steps; the tiny ViT from its initial weights adapts as a
    # whole, so no unit is still by the relative test and the settle test waits for 80% of the run (step 25.6);
    # the units up to the cap (the lower two thirds) freeze together at step 24, once the cosine schedule's steps
    # are small enough that both watched units move by less than the threshold
    out = two_ranks[0]["default_rhythm"]
    assert out["every"] == 2
    transitions = out["transitions"]
    assert [(t["step"], t["epoch"], t["epoch_step"], t["frozen_units"]) for t in transitions] == [(24, 3, 0, 2)]
    # the batches are read once an epoch and again only after a transition inside it: the decision points that keep
    # the layout (three an epoch, most of them here) go on with the loader's read-ahead
    inside = [t["epoch_step"] for t in transitions if t["epoch_step"]]
    assert len(inside) < 3 * 4
    assert sorted(out["reads"]) == sorted([0] * 4 + inside)
