"""``elastic-pipe train`` and plain ``torchrun`` run the same job the same way (threads, seeds, ranks).

Both start two workers of one tiny float64 config: the launcher under the CLI (one OpenMP thread per worker, as
torchrun sets it) and ``torchrun --nproc-per-node 2 -m elastic_pipe.orchestrator``. Their per-step losses must be
equal, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_pipe.cli import main

CONFIG = """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 2, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }
[data]
eval_fraction = 0.8
[train]
epochs = 1
max_steps = 3
dtype = "float64"
global_batch = 32
[pipeline]
pipe_len = 2
microbatches = 2
solver = "optimal"
cache = "off"
[launch]
nproc_per_node = 2
[log]
progress = false
"""


@pytest.mark.distributed
@pytest.mark.slow  # ~30 s on 2 shared cores: two launches of two workers
def test_train_cli_and_torchrun_give_the_same_losses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "ELASTIC_PIPE_FAULT")}
    result = tmp_path / "r.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*torchrun, "-m", "elastic_pipe.orchestrator", "--config", str(config), "--result", str(result)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    by_torchrun = json.loads(result.read_text(encoding="utf-8"))

    assert main(["train", "--config", str(config), "--json"]) == 0
    by_cli = json.loads(capsys.readouterr().out)

    assert len(by_cli["losses"]) == 3
    assert by_cli["losses"] == by_torchrun["losses"]
