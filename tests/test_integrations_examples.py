"""The two trainer examples run end to end (short runs) and report what they promise."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from script_module import load_script

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning", "ignore::ResourceWarning"
)


def _load(name: str) -> ModuleType:
    return load_script(Path("examples") / f"{name}.py")


def test_hf_trainer_example_runs_every_arm(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    out = tmp_path / "hf.json"
    assert _load("hf_trainer_freeze").main(["--epochs", "2", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())
    assert set(runs) == {"no freezing", "FreezeCallback()", "FreezeCallback(cache=True)"}
    assert runs["no freezing"]["timeline"] == []
    assert runs["FreezeCallback(cache=True)"]["timeline"] == runs["FreezeCallback()"]["timeline"]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["steps"] == 40 for r in runs.values())


def test_lightning_example_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    out = tmp_path / "lightning.json"
    assert _load("lightning_freeze").main(["--epochs", "4", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["resume_exact"] is True
    assert result["FreezeCallback"]["steps"] == result["no freezing"]["steps"] == 80
