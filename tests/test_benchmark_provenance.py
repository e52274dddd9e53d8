"""Where a benchmark says it was measured: the commit its code came from, read when the process started."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import _report  # benchmarks/gpu is no package


def test_the_source_comes_from_the_environment_when_it_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_report.COMMIT_ENV, "a" * 40)
    monkeypatch.setenv(_report.DIRTY_ENV, "1")
    assert _report._source() == ("a" * 40, True)
    monkeypatch.setenv(_report.DIRTY_ENV, "0")
    assert _report._source() == ("a" * 40, False)


def test_a_commit_made_while_a_benchmark_runs_is_not_the_one_it_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long CPU job (bench_hf_callback.py under Lightning, 12 minutes) once reported the commit made on its
    branch while it ran, not the one whose code it had imported."""
    before = _report.provenance()
    monkeypatch.setenv(_report.COMMIT_ENV, "b" * 40)  # what git or the environment would say now
    monkeypatch.setenv(_report.DIRTY_ENV, "1")
    after = _report.provenance()
    assert (after["commit"], after["dirty"]) == (before["commit"], before["dirty"]) == _report._SOURCE
    assert after["commit"] != "b" * 40
