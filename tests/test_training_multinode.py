"""Two "nodes" on loopback: two torchrun agents (``elastic-pipe train`` on each) joined by a c10d rendezvous.

2 nodes x 2 processes; the pipeline (length 2) stays inside a node and the replicas span the nodes. After epoch 0
two of three blocks freeze and the job compresses to 1 stage x 4 replicas across both nodes.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_pipe.groups import plan_spmd

CONFIG = """
[model]
name = "vit"
options = {{ preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }}
[data]
eval_fraction = 0.8
[train]
epochs = 2
global_batch = 64
optimizer = "sgd"
lr = 0.05
[freeze]
policy = "manual"
options = {{ schedule = {{ 1 = 2 }} }}
[pipeline]
pipe_len = 2
solver = "optimal"
microbatches = 2
[launch]
nproc_per_node = 2
nnodes = 2
rdzv_endpoint = "127.0.0.1:{port}"
timeout = 60.0
[log]
progress = false
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pipelines_stay_inside_a_node() -> None:
    plan = plan_spmd(4, 2, gpus_per_node=2)
    assert plan.pipeline_groups == ((0, 1), (2, 3))
    assert plan.dp_groups == ((0, 2), (1, 3))


@pytest.mark.distributed
@pytest.mark.slow  # > 20 s on 2 shared cores
def test_two_nodes_run_a_transition(tmp_path: Path) -> None:
    path = tmp_path / "two_nodes.toml"
    path.write_text(CONFIG.format(port=_free_port()))
    secret = secrets.token_hex(16)  # the rendezvous secret, in the environment, never on the command line
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ELASTIC_PIPE_RDZV_SECRET": secret}
    cmd = [sys.executable, "-m", "elastic_pipe", "train", "--config", str(path), "--run-id", "two-nodes", "--json"]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    outputs = []
    try:
        for p in nodes:  # the secret is nowhere in the agents' command lines (world-readable in /proc)
            assert secret not in Path(f"/proc/{p.pid}/cmdline").read_text(errors="replace")
        for p in nodes:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err.decode()[-3000:]
            outputs.append(json.loads(out))
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    for result in outputs:
        assert [(e["pipe_len"], e["replicas"], e["frozen_units"]) for e in result["epochs"]] == [(2, 2, 0), (1, 4, 2)]
        assert [(t["epoch"], t["pipe_len"], t["replicas"]) for t in result["transitions"]] == [(1, 1, 4)]
    # both agents report the same run
    assert outputs[0]["losses"] == outputs[1]["losses"]
