"""Import paths work like torchrun (issue 45): ``elastic-pipe train`` puts the current directory and the config
file's directory on the workers' ``sys.path``, and a module that cannot be imported is named with its key in one
line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

DATA = """
from elastic_pipe.data import load_digits
from elastic_pipe.orchestrator.data import Split


def digits():
    d = load_digits()
    return Split(d.inputs[:160], d.labels[:160], d.sample_ids[:160])
"""

POLICY = """
def one_unit_per_epoch(epoch, step, current):
    return max(current, min(epoch, 1))
"""

CONFIG = """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32 }
[data]
dataset = "cwd_data:digits"
[train]
epochs = 2
global_batch = 32
[freeze]
policy = "cfg_policy:one_unit_per_epoch"
[pipeline]
pipe_len = 2
microbatches = 2
cache = "off"
[launch]
nproc_per_node = 2
[log]
progress = false
"""


@pytest.mark.distributed
@pytest.mark.slow  # one CLI launch of two workers
def test_modules_beside_the_config_and_in_the_current_directory_import_in_every_worker(tmp_path: Path) -> None:
    (tmp_path / "cwd_data.py").write_text(DATA, encoding="utf-8")
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "cfg_policy.py").write_text(POLICY, encoding="utf-8")
    (configs / "run.toml").write_text(CONFIG, encoding="utf-8")
    # -P: Python itself puts neither the current directory nor a script's on sys.path; the launcher must
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "elastic_pipe", "train", "--config", "configs/run.toml", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [e["frozen_units"] for e in result["epochs"]] == [0, 1]  # the function beside the config decided
    assert result["epochs"][0]["samples"] == 128  # the cwd module's 160 digits, 32 held out


def test_a_module_that_does_not_import_is_named_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from elastic_pipe.cli import main

    path = tmp_path / "run.toml"
    path.write_text(CONFIG.replace("cfg_policy:", "missing_policy_module:"), encoding="utf-8")
    (tmp_path / "cwd_data.py").write_text(DATA, encoding="utf-8")  # beside the config: imports
    before = list(sys.path)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "([freeze] policy): cannot import 'missing_policy_module'" in err
    assert sys.path == before  # the run's import paths are the run's only
