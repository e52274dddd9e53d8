"""``elastic-pipe demo``: its configuration, its document, its table and its plot; one short run end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.cli import main
from elastic_pipe.cli.demo import DEFAULT_PLOT, plot, plot_path, render, summarize
from elastic_pipe.orchestrator.demo import REFERENCE, demo_config, steps_per_epoch


def _epoch(epoch: int, frozen: int, seconds: float, accuracy: float, **extra: Any) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "loss": 1.5 - epoch,
        "eval_accuracy": accuracy,
        "pipe_len": 1,
        "replicas": 2,
        "frozen_units": frozen,
        "samples_per_s": 1000.0 / seconds,
        "seconds": seconds,
        **extra,
    }


RESULTS = {
    "elastic": {
        "epochs": [_epoch(0, 0, 10.0, 0.5, steps=44), _epoch(1, 2, 5.0, 0.75, steps=44)],
        "transitions": [{"epoch": 1, "frozen_units": 2, "pipe_len": 1, "replicas": 2, "seconds": 0.5}],
        "final_accuracy": 0.75,
    },
    "baseline": {
        "epochs": [_epoch(0, 0, 10.0, 0.5), _epoch(1, 0, 9.0, 0.76)],
        "transitions": [],
        "final_accuracy": 0.76,
    },
}


def test_config_is_two_replicas_with_freezeout_over_the_whole_run() -> None:
    config = demo_config()
    assert (config.world_size, config.pipeline.pipe_len, config.pipeline.cache) == (2, 1, "on")
    assert steps_per_epoch(config) == (1797 - 359) // 32 == 44
    assert dict(config.freeze.options) == {"t0": 0.5, "total_steps": 44 * 6}
    assert dict(demo_config({"train.epochs": 2}).freeze.options)["total_steps"] == 88
    reference = config.override(REFERENCE)
    assert (reference.freeze.policy, reference.pipeline.cache) == ("never", "off")


def test_document_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    doc = summarize(RESULTS)
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
    assert render(doc).splitlines() == [
        "epoch  frozen  K  R  loss    accuracy  seconds",
        "    1       0  1  2  1.5000     0.500    10.00",
        "    2       2  1  2  0.5000     0.750     5.00",
        "transition before epoch 2: frozen 2, pipeline 1, replicas 2, 0.500 s",
        "with freezing: final accuracy 0.750, training 15.5 s",
        "without freezing: final accuracy 0.760, training 19.0 s",
        "-> freezing is 1.23x as fast, accuracy -1.0 points",
        "epoch 1 did the same work in both runs: 10.0 s and 10.0 s",
        "plot: /tmp/demo.png",
    ]
    json.dumps(doc)  # the --json document is plain data


def test_says_when_the_load_changed_between_runs() -> None:
    slow = {**RESULTS["baseline"], "epochs": [_epoch(0, 0, 12.0, 0.5), _epoch(1, 0, 9.0, 0.76)]}
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
def test_two_epochs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 epochs: FreezeOut freezes block 0 at half the run, so the run has one transition and a cached epoch."""
    png = tmp_path / "demo.png"
    assert main(["demo", "--epochs", "2", "--json", "--plot", str(png), "--log-dir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["frozen_units"] for e in doc["epochs"]] == [0, 1]
    assert doc["baseline"]["frozen_per_epoch"] == [0, 0]
    assert [t["epoch"] for t in doc["transitions"]] == [1]
    # Same seed, data order and layout: the runs agree until the first freeze.
    assert doc["epochs"][0]["eval_accuracy"] == doc["baseline"]["epochs"][0]["eval_accuracy"]
    assert doc["plot"] == str(png.resolve()) and png.stat().st_size > 1000
    assert (tmp_path / "events.jsonl").exists()
