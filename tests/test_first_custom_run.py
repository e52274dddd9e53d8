"""docs/first_custom_run.md runs as written (issue 45): the TOML form through the CLI (the user's module beside the
config), the API form on 2 ranks, and the exported model predicting on raw inputs in a fresh process as the run's
evaluation did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.testing import RankContext, run_distributed

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "first_run"

RELOAD = """
import sys, torch
from safetensors.torch import load_file
from elastic_pipe.data import load_digits
from elastic_pipe.orchestrator import load_config
from elastic_pipe.orchestrator.components import build_model
sys.path.insert(0, sys.argv[1])
from my_task import preprocess
model = build_model(load_config(sys.argv[1] + "/run.toml"))
model.load_state_dict(load_file("model.safetensors"))
model.eval()
d = load_digits()
with torch.no_grad():
    predicted = model(preprocess(d.inputs[1400:])).argmax(-1)
print(float((predicted == d.labels[1400:]).double().mean()))
"""


def _python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-P", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600, check=False
    )


@pytest.mark.distributed
@pytest.mark.slow  # one CLI run of 2 workers, an export and a reload
def test_the_toml_form_then_export_and_reload_on_raw_inputs(tmp_path: Path) -> None:
    config = str(EXAMPLE / "run.toml")
    done = _python(["-m", "elastic_pipe", "train", "--config", config, "--epochs", "4", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [e["frozen_units"] for e in result["epochs"]] == [0, 0, 0, 1]  # OneBlockPerEpoch(start=3) decided
    assert result["epochs"][0]["samples"] == 1376  # all 1,400 training digits (43 steps of 32): none held out
    assert (tmp_path / "runs" / "first" / "ckpt" / "latest.json").is_file()  # relative to the current directory
    done = _python(
        ["-m", "elastic_pipe", "export", "--checkpoint", "runs/first/ckpt", "--out", "model.safetensors"], tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    done = _python(["-c", RELOAD, str(EXAMPLE)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout) == pytest.approx(result["final_accuracy"], abs=1e-9)


def _api(ctx: RankContext, out: str) -> dict[str, Any]:
    del ctx
    sys.path.insert(0, str(EXAMPLE))
    import train_api

    return train_api.main(out, {"train.epochs": 4})


@pytest.mark.distributed
@pytest.mark.slow  # a 4-epoch run on 2 ranks
def test_the_api_form_returns_the_same_result_on_every_rank(tmp_path: Path) -> None:
    results = run_distributed(_api, 2, str(tmp_path), timeout=300)
    result, other = results
    # the same training numbers on every rank (wall times are each rank's own)
    for key in ("losses", "final_accuracy", "final_eval_loss"):
        assert result[key] == other[key], key
    fields = ("epoch", "loss", "eval_loss", "eval_accuracy", "frozen_units", "pipe_len", "replicas")
    assert [[e[f] for f in fields] for e in result["epochs"]] == [[e[f] for f in fields] for e in other["epochs"]]
    times = {"seconds", "setup_s", "close_phases"}
    assert set(result) == {"epochs", "transitions", "losses", "final_accuracy", "final_eval_loss", *times}
    assert set(result["close_phases"]) == {"stage", "cache", "loaders", "log", "groups", "process_group"}
    assert [e["frozen_units"] for e in result["epochs"]] == [0, 0, 0, 1]
    assert result["final_accuracy"] > 0.5 and (tmp_path / "model.safetensors").is_file()
