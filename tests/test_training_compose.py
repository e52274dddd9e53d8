"""The trainer composes the user's own objects: a policy from outside the toolkit drives training by object (API)
and by import path (``elastic-pipe train``, spawned workers), and ``plan --config`` predicts the layouts that
``train --config`` then runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
CONFIG = """
[model]
name = "vit"
options = {{ preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }}
[data]
eval_fraction = 0.8
[train]
epochs = 3
global_batch = 64
[freeze]
policy = "{policy}"
[pipeline]
pipe_len = 4
microbatches = 2
cache = "off"
[launch]
nproc_per_node = 4
backend = "gloo"
[log]
progress = false
"""


def _by_object(ctx: RankContext) -> dict[str, Any]:
    sys.path.insert(0, str(PLUGINS))
    from plug_policy import OneUnitPerEpoch

    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    config = config_from_tables(
        {
            "model": {"name": "vit"},
            "train": {"epochs": 3, "global_batch": 32},
            "pipeline": {"pipe_len": 2, "microbatches": 2, "solver": "optimal"},
            "launch": {"nproc_per_node": 2},
            "log": {"progress": False},
        }
    )
    model = models.vit(config="vit-tiny", depth=3, dim=16, heads=2, mlp_dim=32)
    policy = OneUnitPerEpoch(num_layers=len(model.unit_ends), limit=2)
    with ElasticTrainer(
        config, model=model, data=Split(d.inputs[:160], d.labels[:160], d.sample_ids[:160]), policy=policy, quiet=True
    ) as trainer:
        result = trainer.fit()
    return {"frozen": [e["frozen_units"] for e in result.epochs], "evals": len(policy.evals)}


@pytest.mark.distributed
@pytest.mark.slow  # > 20 s on 2 shared cores
def test_a_user_policy_object_drives_the_trainer() -> None:
    results = run_distributed(_by_object, 2, timeout=180)
    assert [r["frozen"] for r in results] == [[0, 1, 2]] * 2
    # the held-out loss before each of the two decision points reached the policy on rank 0, the rank that decides
    assert [r["evals"] for r in results] == [2, 0]


def _cli(args: list[str], tmp_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "elastic_pipe", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


@pytest.mark.distributed
@pytest.mark.slow  # > 20 s on 2 shared cores
def test_a_policy_by_import_path_trains_under_the_cli_and_plan_predicts_the_layouts(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(policy="plug_policy:OneUnitPerEpoch"), encoding="utf-8")
    planned = _cli(["plan", "--config", str(path)], tmp_path)
    trained = _cli(["train", "--config", str(path)], tmp_path)
    ran = [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in trained["epochs"]]
    assert ran == [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in planned["epochs"]]
    assert [f for f, _, _ in ran] == [0, 1, 2]  # the user's policy decided, in every spawned worker
    assert len({k for _, k, _ in ran}) > 1  # and the pipeline really reshaped
