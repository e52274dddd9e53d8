"""``elastic-pipe demo``: its configuration, its document, its table and its plot; one short run end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.cli import main
from elastic_pipe.cli.demo import DEFAULT_PLOT, plot, plot_path, render, summarize
from elastic_pipe.orchestrator.config import load_config
from elastic_pipe.orchestrator.demo import DEMO, REFERENCE, budget_report, demo_config, steps_per_epoch
from elastic_pipe.orchestrator.dry_run import planned_epochs
from elastic_pipe.orchestrator.errors import ConfigError


def _epoch(
    epoch: int, frozen: int, seconds: float, accuracy: float, *, k: int = 1, r: int = 2, **extra: Any
) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "loss": 1.5 - epoch,
        "eval_accuracy": accuracy,
        "pipe_len": k,
        "replicas": r,
        "frozen_units": frozen,
        "samples_per_s": 1000.0 / seconds,
        "seconds": seconds,
        **extra,
    }


RESULTS = {
    "elastic": {
        "epochs": [_epoch(0, 0, 10.0, 0.5, k=2, r=1, steps=44), _epoch(1, 2, 5.0, 0.75, steps=44)],
        "transitions": [{"epoch": 1, "frozen_units": 2, "pipe_len": 1, "replicas": 2, "seconds": 0.5}],
        "final_accuracy": 0.75,
    },
    "baseline": {
        "epochs": [_epoch(0, 0, 10.0, 0.5, k=2, r=1), _epoch(1, 0, 9.0, 0.76, k=2, r=1)],
        "transitions": [],
        "final_accuracy": 0.76,
    },
}


def test_config_is_a_budgeted_pipeline_with_freezeout_over_the_whole_run() -> None:
    config = demo_config()
    assert (config.world_size, config.pipeline.pipe_len, config.pipeline.cache) == (2, 2, "on")
    assert config.pipeline.memory_budget_bytes == 40 * 2**20
    assert steps_per_epoch(config) == (1797 - 359) // 32 == 44
    assert config.train.epochs == 8
    assert dict(config.freeze.options) == {"t0": 0.4, "total_steps": 44 * 8}
    assert dict(demo_config({"train.epochs": 2}).freeze.options)["total_steps"] == 88
    reference = config.override(REFERENCE)
    assert reference.freeze.policy == "never"
    a, b = reference.to_dict(), config.to_dict()
    assert {s: a[s] for s in a if s != "freeze"} == {s: b[s] for s in b if s != "freeze"}  # freezing alone differs
    assert reference.pipeline.memory_budget_bytes == config.pipeline.memory_budget_bytes  # the same budget


def test_the_budget_allows_a_two_stage_pipeline_and_not_one_stage() -> None:
    report = budget_report(demo_config())
    limit, whole = report["limit_bytes"], report["training_state_bytes"]
    assert limit == 40 * 2**20 < whole
    one, two = report["start"]
    assert (one["pipe_len"], one["replicas"], one["fits"], one["rank_bytes"]) == (1, 2, False, whole)
    assert (two["pipe_len"], two["replicas"], two["fits"]) == (2, 1, True)
    assert whole / 2 <= two["rank_bytes"] <= limit  # the fuller of the two stages
    with pytest.raises(ConfigError, match="memory_budget"):
        budget_report(demo_config({"pipeline.memory_budget": ""}))


def test_the_reference_is_the_two_stage_pipeline_and_the_demo_compresses_it() -> None:
    """The plan (the layout rule the run calls): the reference keeps 2 stages x 1 replica, the best static layout
    the budget allows on 2 processes; the elastic run compresses to 1 stage x 2 replicas once half the blocks are
    frozen, and runs its last 3 of 8 epochs so, skipping 14 of the 48 block-epochs."""

    def layouts(config: Any) -> list[tuple[int, int, int]]:
        return [(r["frozen_units"], r["pipe_len"], r["replicas"]) for r in planned_epochs(config)]

    assert layouts(demo_config().override(REFERENCE)) == [(0, 2, 1)] * 8
    plan = layouts(demo_config())
    assert plan == [(0, 2, 1)] * 4 + [(2, 2, 1), (3, 1, 2), (4, 1, 2), (5, 1, 2)]
    assert sum(frozen for frozen, _, _ in plan) == 14  # block-epochs skipped, of 6 x 8
    assert sum(1 for _, k, r in plan if (k, r) == (1, 2)) == 3  # epochs run compressed
    # Under a budget the whole training state fits, the job starts as 1 stage x 2 replicas: 40 MiB makes it a pipeline.
    assert layouts(demo_config({"pipeline.memory_budget": "64MiB"}))[0] == (0, 1, 2)


BUDGET = {
    "limit_bytes": 40 * 2**20,
    "training_state_bytes": 48 * 2**20,
    "start": [
        {"pipe_len": 1, "replicas": 2, "rank_bytes": 48 * 2**20, "fits": False},
        {"pipe_len": 2, "replicas": 1, "rank_bytes": 25 * 2**20, "fits": True},
    ],
}


def test_the_example_file_is_the_demos_run() -> None:
    """examples/vit_digits.toml is the demo's elastic run, so the demo's measured accuracy and times are its own."""
    example = load_config(Path(__file__).resolve().parents[1] / "examples" / "vit_digits.toml")
    demo = demo_config()
    a, b = example.to_dict(), demo.to_dict()
    assert {s: a[s] for s in a if s not in ("freeze", "launch")} == {
        s: b[s] for s in b if s not in ("freeze", "launch")
    }
    assert (example.freeze.policy, dict(example.freeze.options)) == ("freezeout", {"t0": 0.4})
    assert example.world_size == demo.world_size == 2
    assert planned_epochs(example) == planned_epochs(demo)  # the run's total_steps fills FreezeOut's in both


def test_document_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    doc = summarize(RESULTS, BUDGET)
    assert doc["budget"] == BUDGET
    assert doc["transitions"] == [{"epoch": 1, "frozen": 2, "pipe_len": 1, "replicas": 2, "seconds": 0.5}]
    assert doc["final_accuracy"] == 0.75
    assert doc["train_seconds"] == 15.5
    assert doc["epochs"][1] == _epoch(1, 2, 5.0, 0.75)  # only the documented keys
    assert doc["baseline"] == {
        "final_accuracy": 0.76,
        "train_seconds": 19.0,
        "frozen_per_epoch": [0, 0],
        "epochs": RESULTS["baseline"]["epochs"],
    }
    assert doc["speedup"] == pytest.approx(19.0 / 15.5)
    assert doc["accuracy_change"] == pytest.approx(-0.01)
    assert doc["same_work"] == {"epochs": 1, "seconds": 10.0, "baseline_seconds": 10.0}
    assert "note" not in doc  # 2 processes on 2 cores
    doc["plot"] = "/tmp/demo.png"
    doc["wall_seconds"] = 40.31
    doc["machine"] = {"cpus": 2, "load_average_start": 1.04, "load_average_end": 2.0}
    assert render(doc).splitlines() == [
        "memory budget 40.0 MiB a rank (weights, gradients and optimizer state; the whole model's: 48.0 MiB)",
        "at the start, the fullest rank holds: K=1 R=2 48.0 MiB (does not fit), K=2 R=1 25.0 MiB (fits)",
        "epoch  frozen  K  R  loss    accuracy  seconds  | reference K  R  accuracy  seconds",
        "    1       0  2  1  1.5000     0.500    10.00  |           2  1     0.500    10.00",
        "    2       2  1  2  0.5000     0.750     5.00  |           2  1     0.760     9.00",
        "transition before epoch 2: frozen 2, pipeline 1, replicas 2, 0.500 s",
        "with freezing: final accuracy 0.750, training 15.5 s",
        "without freezing: final accuracy 0.760, training 19.0 s",
        "-> freezing is 1.23x as fast, accuracy -1.0 points",
        "epoch 1 did the same work in both runs: 10.0 s and 10.0 s",
        "wall 40.3 s on 2 CPU cores, load average 1.0 -> 2.0",
        "plot: /tmp/demo.png",
    ]
    json.dumps(doc)  # the --json document is plain data


def test_says_when_the_load_changed_between_runs() -> None:
    slow = {**RESULTS["baseline"], "epochs": [_epoch(0, 0, 12.0, 0.5, k=2, r=1), _epoch(1, 0, 9.0, 0.76, k=2, r=1)]}
    doc = summarize({**RESULTS, "baseline": slow})
    assert doc["same_work"] == {"epochs": 1, "seconds": 10.0, "baseline_seconds": 12.0}
    assert render(doc).splitlines()[-1] == (
        "epoch 1 did the same work in both runs: 10.0 s and 12.0 s "
        "(the machine's load changed between the runs, so the speedup is only approximate)"
    )


def test_without_reference_and_on_fewer_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    doc = summarize({"elastic": RESULTS["elastic"]})
    assert "baseline" not in doc and "speedup" not in doc
    assert doc["note"].startswith("2 processes share 1 CPU cores")
    lines = render(doc).splitlines()
    assert lines[-2:] == ["with freezing: final accuracy 0.750, training 15.5 s", f"note: {doc['note']}"]


def test_plot_and_its_path(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "demo.png"
    plot(summarize(RESULTS), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def args(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"no_plot": False, "plot": None, "log_dir": "", **kw})

    assert plot_path(args()) == DEFAULT_PLOT
    assert plot_path(args(log_dir="runs/a")) == str(Path("runs/a") / DEFAULT_PLOT)
    assert plot_path(args(plot="x.png", log_dir="runs/a")) == "x.png"
    assert plot_path(args(plot="x.png", no_plot=True)) is None


@pytest.mark.distributed
@pytest.mark.slow
def test_two_epochs_end_to_end_compress_the_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 epochs with FreezeOut at ``t0 = 0.25`` (the demo's 0.4 freezes 2 blocks in 2 epochs, too few to
    compress): blocks 0-2 freeze at half the run, so the 2-stage pipeline compresses to 1 stage x 2 replicas for the
    second epoch, as the plan says; the reference stays the 2-stage pipeline."""
    monkeypatch.setitem(DEMO["freeze"], "options", {"t0": 0.25})  # the workers get the config the CLI builds
    planned = [
        (r["frozen_units"], r["pipe_len"], r["replicas"]) for r in planned_epochs(demo_config({"train.epochs": 2}))
    ]
    assert planned == [(0, 2, 1), (3, 1, 2)]
    png = tmp_path / "demo.png"
    assert main(["demo", "--epochs", "2", "--json", "--plot", str(png), "--log-dir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in doc["epochs"]] == planned
    assert [(e["pipe_len"], e["replicas"]) for e in doc["baseline"]["epochs"]] == [(2, 1)] * 2
    assert doc["baseline"]["frozen_per_epoch"] == [0, 0]
    assert [(t["epoch"], t["frozen"], t["pipe_len"], t["replicas"]) for t in doc["transitions"]] == [(1, 3, 1, 2)]
    assert [(s["pipe_len"], s["fits"]) for s in doc["budget"]["start"]] == [(1, False), (2, True)]
    # Same seed, data order and layout: the runs agree until the first freeze.
    assert doc["same_work"]["epochs"] == 1
    assert doc["epochs"][0]["eval_accuracy"] == doc["baseline"]["epochs"][0]["eval_accuracy"]
    assert doc["wall_seconds"] > doc["train_seconds"] and doc["machine"]["cpus"] >= 1
    assert doc["plot"] == str(png.resolve()) and png.stat().st_size > 1000
    assert (tmp_path / "events.jsonl").exists()
