"""Several stages per rank (``[pipeline] virtual``, issue #43): an interleaved run computes what a fixed run computes.

The elastic runs hold v = 2 stages on each of 2 gloo ranks (4 stages, loop placement: rank 0 runs stages 0 and 2,
rank 1 stages 1 and 3) under the interleaved 1F1B schedule (or GPipe over the virtual stages, torch's looped BFS
order); the reference is one process training the whole model with no pipeline. Same seed, data order, global batch
and freeze decisions, float64 on CPU: only the order of floating-point sums differs, so the losses agree to 1e-10.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tiny_vit
from elastic_pipe.freeze import ManualSchedule
from elastic_pipe.groups import plan_spmd
from elastic_pipe.orchestrator.dry_run import planned_epochs
from elastic_pipe.orchestrator.layout.compression import COMPRESSION_RULES
from elastic_pipe.orchestrator.layout.rule import decide_units, next_layout
from elastic_pipe.orchestrator.layout.start import MemoryBudget, initial_layout
from elastic_pipe.orchestrator.transition import held_sublayers, owned_sublayers, plan_transfers
from elastic_pipe.testing import RankContext, run_distributed
from elastic_pipe.types import Layout

#: Runs on a 160-sample slice of the digits so that 2 epochs take a few seconds.
SAMPLES = 160
#: Steps of one epoch: 4/5 of the samples train, 32 a step.
STEPS = (SAMPLES - SAMPLES // 5) // 32


def test_the_layout_rule_cuts_v_stages_per_rank_and_keeps_v_at_transitions() -> None:
    costs = [1.0] * 8
    layout, budget = initial_layout(costs, 2, 2, solver="optimal", microbatches=2, virtual=2)
    assert layout == Layout(0, 2, 1, (0, 2, 4, 6, 8), 2, virtual=2)
    assert budget == 4.0  # the bottleneck of 2 ranks' blocks, what the compression rule compares
    # one stage per rank: the layout of before, bit for bit
    assert initial_layout(costs, 2, 2, solver="optimal", microbatches=2) == (Layout(0, 2, 1, (0, 4, 8), 2), 4.0)
    kept = next_layout(
        layout, 3, costs, compression=COMPRESSION_RULES["none"], solver="optimal", budget=budget, world_size=2
    )
    assert kept == Layout(3, 2, 1, (3, 5, 6, 7, 8), 2, virtual=2)
    # halving: 3 active sub-layers fill 1 rank x 2 stages, never 2 x 2
    halved = next_layout(
        layout, 5, costs, compression=COMPRESSION_RULES["halving"], solver="optimal", budget=budget, world_size=2
    )
    assert (halved.pipe_len, halved.replicas, halved.virtual, halved.boundaries) == (1, 2, 2, (5, 7, 8))
    # freezing stops while every one of the K x v stages (v on one rank, when the rule may shorten) keeps a layer
    for rule, cap in (("none", 4), ("halving", 6)):
        units = decide_units(
            ManualSchedule(7, {1: 7}),
            epoch=1,
            step=1,
            current=0,
            unit_ends=(1, 2, 3, 4, 5, 6, 7),
            num_sublayers=8,
            pipe_len=2,
            compression=COMPRESSION_RULES[rule],
            virtual=2,
        )
        assert units == cap


def test_a_rank_holds_and_receives_the_layers_of_all_its_stages() -> None:
    layout = Layout(2, 2, 1, (2, 3, 4, 6, 8), 2, virtual=2)  # rank 0: stages 0, 2; rank 1: stages 1, 3
    plan = plan_spmd(2, 2)
    assert owned_sublayers(layout, plan, 0) == (2, 4, 5)
    assert owned_sublayers(layout, plan, 1) == (3, 6, 7)
    assert held_sublayers(layout, plan, 0) == (0, 1, 2, 4, 5)  # with the frozen prefix
    budget = MemoryBudget(100, (1,) * 8, (10,) * 8)
    assert budget.stage_bytes(layout) == [3 + 20, 3]
    # 4 stages over 2 ranks -> 2 stages on 1 rank and 2 replicas: each rank gains what its position lacks
    one = Layout(5, 1, 2, (5, 6, 8), 1, virtual=2)
    moves = [(t.src, t.dst, t.sublayers, t.optimizer_state) for t in plan_transfers(layout, one, plan, plan_spmd(2, 1))]
    assert moves == [(0, 1, (0, 1, 2, 4), False), (0, 1, (5,), True), (1, 0, (3,), False), (1, 0, (6, 7), True)]


def _config(freeze: dict[int, int] | None = None, **pipeline: Any) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 2, "global_batch": 32, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
        "freeze": {"policy": "manual", "options": {"schedule": freeze or {}}},
        "pipeline": {"microbatches": 2, "solver": "optimal", "cache": "off", **pipeline},
        "launch": {"nproc_per_node": pipeline.get("pipe_len", 1)},
        "log": {"progress": False},
    }
    return config_from_tables(tables)


def _samples() -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])


def _run(ctx: RankContext, configs: dict[str, Any]) -> dict[str, Any]:
    from elastic_pipe.orchestrator import run_rank

    return {name: run_rank(config, samples=_samples(), quiet=True).to_dict() for name, config in configs.items()}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The whole model in one process, no pipeline: without and with the freezes the elastic runs make."""
    configs = {"fixed": _config(), "frozen1": _config({1: 1}), "frozen2": _config({1: 2})}
    (results,) = run_distributed(_run, 1, configs, timeout=120)
    return results  # type: ignore[no-any-return]


@pytest.mark.distributed
@pytest.mark.parametrize("schedule", ["interleaved", "gpipe"])
def test_two_stages_per_rank_train_as_one_process(schedule: str, reference: dict[str, Any]) -> None:
    config = _config(pipe_len=2, virtual=2, schedule=schedule, compression="none")
    results = run_distributed(_run, 2, {"virtual": config}, timeout=180)
    run, fixed = results[0]["virtual"], reference["fixed"]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in run["epochs"]] == [(0, 2, 1), (0, 2, 1)]
    assert len(run["losses"]) == len(fixed["losses"]) == 2 * STEPS
    assert run["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert results[1]["virtual"]["losses"] == run["losses"]  # every rank reports the same numbers
    assert run["losses"][-1] != pytest.approx(run["losses"][0], rel=1e-3)  # and training did something


@pytest.mark.distributed
def test_two_replicas_of_two_stages_per_rank_average_every_stage(reference: dict[str, Any]) -> None:
    """4 ranks: 2 replicas of a 2-rank pipeline, 2 stages on each rank; the gradients of both stages a rank holds
    are averaged with the other replica's."""
    config = _config(pipe_len=2, virtual=2, schedule="interleaved", compression="none").override(
        {"launch.nproc_per_node": 4}
    )
    results = run_distributed(_run, 4, {"virtual": config}, timeout=240)
    run = results[0]["virtual"]
    assert [(e["pipe_len"], e["replicas"]) for e in run["epochs"]] == [(2, 2), (2, 2)]
    assert run["losses"] == pytest.approx(reference["fixed"]["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(reference["fixed"]["final_eval_loss"], rel=1e-10)
    assert all(r["virtual"]["losses"] == run["losses"] for r in results)


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("compression", "units", "shapes", "boundaries", "cache"),
    [
        # the rule keeps 2 ranks: the 5 active sub-layers are cut into 4 stages again, 2 on each rank
        ("none", 1, [(0, 2, 1), (1, 2, 1)], [3, 4, 5, 6, 8], "off"),
        # 3 active sub-layers cannot fill 2 ranks x 2 stages: 1 rank holds both stages, 2 replicas; the frozen
        # prefix is served from the activation cache
        ("halving", 2, [(0, 2, 1), (2, 1, 2)], [5, 6, 8], "on"),
    ],
)
def test_a_transition_re_partitions_the_stages_of_every_rank(  # noqa: PLR0917 - the parametrized cases
    compression: str,
    units: int,
    shapes: list[tuple[int, int, int]],
    boundaries: list[int],
    cache: str,
    reference: dict[str, Any],
) -> None:
    config = _config({1: units}, pipe_len=2, virtual=2, schedule="interleaved", compression=compression, cache=cache)
    results = run_distributed(_run, 2, {"virtual": config}, timeout=180)
    run, frozen = results[0]["virtual"], reference[f"frozen{units}"]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in run["epochs"]] == shapes
    assert [e["cache"] for e in run["epochs"]] == [False, cache == "on"]
    (transition,) = run["transitions"]
    assert transition["boundaries"] == boundaries  # v = 2 stages per rank: 2 * pipe_len + 1 boundaries
    assert [e["boundaries"] for e in planned_epochs(config)] == [[0, 2, 4, 6, 8], boundaries]  # the dry run agrees
    assert run["losses"] == pytest.approx(frozen["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(frozen["final_eval_loss"], rel=1e-10)
    assert results[1]["virtual"]["losses"] == run["losses"]


@pytest.mark.distributed
@pytest.mark.parametrize(("compression", "units"), [("none", 1), ("halving", 2)])
def test_the_zero_bubble_schedule_trains_through_a_transition(
    compression: str, units: int, reference: dict[str, Any]
) -> None:
    """ZB-H1 (``zb1p``, one stage per rank: input and weight gradients apart) with a transition inside."""
    config = _config({1: units}, pipe_len=2, schedule="zb1p", compression=compression)
    results = run_distributed(_run, 2, {"zb": config}, timeout=180)
    run, frozen = results[0]["zb"], reference[f"frozen{units}"]
    assert len(run["transitions"]) == 1
    assert run["losses"] == pytest.approx(frozen["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(frozen["final_eval_loss"], rel=1e-10)


def _drift_run(ctx: RankContext, config: Any) -> dict[str, Any]:
    """``config`` trained under a drift policy that records the probe's changes and freezes a unit whenever asked."""
    from elastic_pipe.orchestrator import ElasticTrainer
    from recording_drift import RecordingDrift

    policy = RecordingDrift(3, threshold=1e9, patience=1, tolerance=None)  # every change is below the threshold
    with ElasticTrainer(config, data=_samples(), policy=policy, quiet=True) as trainer:
        result = trainer.fit()
    shapes = [(t["frozen_units"], t["pipe_len"]) for t in result.transitions]
    return {"seen": policy.seen, "shapes": shapes, "losses": result.losses}


@pytest.mark.distributed
def test_the_freeze_probe_travels_down_two_stages_per_rank() -> None:
    """The probe runs through 2 ranks x 2 stages, then (halving, 2 units frozen) through 2 stages on one rank."""
    tables = {"freeze.decide_every": 2}
    (one,) = run_distributed(_drift_run, 1, _config().override(tables), timeout=120)
    config = _config(pipe_len=2, virtual=2, schedule="interleaved", compression="halving").override(tables)
    results = run_distributed(_drift_run, 2, config, timeout=180)
    run = results[0]
    assert run["shapes"] == [(1, 2), (2, 1)] and [u for u, _ in one["shapes"]] == [1, 2]
    assert len(run["seen"]) == len(one["seen"]) >= 3  # a measurement at every decision point
    for mine, reference in zip(run["seen"], one["seen"], strict=True):
        assert mine == pytest.approx(reference, rel=1e-9, abs=1e-12)
    assert run["losses"] == pytest.approx(one["losses"], rel=1e-10, abs=1e-12)


@pytest.mark.distributed
@pytest.mark.parametrize(("schedule", "virtual"), [("interleaved", 2), ("zb1p", 1)])
def test_the_cli_trains_the_example_and_re_partitions_at_its_transitions(
    schedule: str, virtual: int, tmp_path: Path
) -> None:
    """``elastic-pipe train`` on the example config with ``schedule = "interleaved"`` and ``virtual = 2``
    (docs/schedule.md gives the command), and with the zero-bubble ``zb1p``: 2 gloo ranks, K x v stages, FreezeOut
    freezing 2 units after the first epoch; the transition re-cuts the active sub-layers into K x v stages and the
    run learns."""
    root = Path(__file__).resolve().parent.parent
    argv = [
        sys.executable, "-m", "elastic_pipe", "train", "--config", str(root / "examples" / "vit_digits.toml"),
        "--epochs", "2", "--set", f"pipeline.schedule={schedule}", "--set", f"pipeline.virtual={virtual}",
        "--set", "log.progress=false", "--set", f"log.dir={tmp_path / 'log'}", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert [(e["pipe_len"], e["frozen_units"]) for e in doc["epochs"]] == [(2, 0), (2, 2)]
    (transition,) = doc["transitions"]
    assert transition["frozen_units"] == 2 and len(transition["boundaries"]) == 2 * virtual + 1  # K x v stages
    assert transition["boundaries"][0] == transition["frozen"]  # the first stage starts after the frozen prefix
    assert doc["final_accuracy"] > 0.5  # ten classes: chance is 0.1
