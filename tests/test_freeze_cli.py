"""`elastic-pipe freeze-plan`: JSON plans, the text timeline, one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from elastic_pipe.cli import main


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["freeze-plan", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)  # exactly one JSON document, nothing else
    assert isinstance(document, dict)
    return document


def test_alpha_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "--policy", "alpha", "--alpha", "1/3", "--layers", "12", "--epochs", "10")
    assert doc["frozen_by_epoch"] == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]
    assert doc["policy"] == "alpha" and doc["num_layers"] == 12 and doc["epochs"] == 10
    doc = _json(capsys, "--policy", "alpha", "--alpha", "0.5", "--layers", "12", "--epochs", "5")
    assert doc["frozen_by_epoch"] == [0, 6, 9, 11, 12]


def test_alpha_plan_text_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["freeze-plan", "--policy", "alpha", "--alpha", "0.5", "--layers", "4", "--epochs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "freeze plan: alpha (alpha=0.5), 4 layers, 3 epochs"
    assert lines[2:] == ["    0       0  ....", "    1       2  ##..", "    2       3  ###."]


def test_other_schedule_policies(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, "--policy", "manual", "--schedule", "2:4,5:8", "--layers", "12", "--epochs", "7")
    assert doc["frozen_by_epoch"] == [0, 0, 4, 4, 4, 8, 8]
    doc = _json(capsys, "--policy", "freezeout", "--t0", "0.5", "--layers", "4", "--epochs", "10")
    assert doc["frozen_by_epoch"] == [0, 0, 0, 0, 0, 1, 1, 2, 3, 4]  # stops at epochs 5, 6.25, 7.5, 8.75
    doc = _json(capsys, "--policy", "never", "--layers", "3", "--epochs", "2")
    assert doc["frozen_by_epoch"] == [0, 0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "alpha", "--layers", "12", "--epochs", "3"], "needs --alpha"),
        (["--policy", "alpha", "--alpha", "x", "--layers", "12", "--epochs", "3"], "not a number"),
        (["--policy", "alpha", "--alpha", "2", "--layers", "12", "--epochs", "3"], "alpha must be in"),
        (["--policy", "alpha", "--alpha", "0.5", "--layers", "0", "--epochs", "3"], "num_layers must be"),
        (["--policy", "alpha", "--alpha", "0.5", "--layers", "4", "--epochs", "0"], "epochs must be an integer >= 1"),
        (["--policy", "paper", "--alpha", "0.5", "--layers", "12", "--epochs", "3"], "gradient statistics"),
        (["--policy", "nope", "--layers", "12", "--epochs", "3"], "not a known freeze policy"),
        (["--policy", "manual", "--schedule", "3:9,4:1", "--layers", "12", "--epochs", "3"], "non-decreasing"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["freeze-plan", *argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err
