"""Suite-wide settings.

Torch runs on one thread in the tests: the ops here are tiny, and on a 2-core CI machine intra-op threads only
add contention with the gloo processes that the distributed tests spawn (measured: one small training test 17 s
with default threading vs 0.1 s with one thread on a loaded machine).

Tests not marked ``gpu`` see no CUDA device, in this process and in the processes they start
(``CUDA_VISIBLE_DEVICES`` is emptied and ``torch.cuda`` answers "none"), so on a machine with GPUs they run exactly
as on CI: on the CPU, with gloo, without ``compile = "auto"`` switching torch.compile on. The ``gpu`` tests see the
devices and cover the CUDA paths (NCCL, compiled and graphed steps, CUDA RNG resume, pinned cache tiers), including
a job with more local ranks than GPUs (``tests/test_launch_failures.py``).

The ranks of ``run_distributed`` fork from a server that has imported torch and the orchestrator once
(``ELASTIC_PIPE_TEST_START=forkserver``) unless the environment names ``spawn``: each spawned rank imports them again,
about 5 s of CPU on the 2-core CI machine, and the whole suite took 16 min 33 s this way (``.ci/run`` at 9fa879b)
against 26 min 6 s with spawned ranks (a948d57; the same 2,884 tests passing; docs/testing.md). The one test whose
timing was seen to differ under the fork server keeps spawned ranks (``tests/test_groups_distributed.py``).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from elastic_pipe.testing.distributed import START_ENV

torch.set_num_threads(1)
os.environ.setdefault(START_ENV, "forkserver")


@pytest.fixture(autouse=True)
def _no_cuda_unless_marked_gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide CUDA from every test that is not marked ``gpu`` (see the module docstring)."""
    if request.node.get_closest_marker("gpu") is not None:
        return
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def one_rank_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of a one-rank job in this process (a rank of ``run_distributed`` is a daemonic process,
    which may not start ``DataLoader`` workers): ``RANK``, ``WORLD_SIZE`` and a free local port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
