"""The launcher's decisions (run id, rendezvous, worker threads, first line) and its loopback-only stores.

Nothing here starts a worker: the decisions are pure functions, and the stores are built and met in-process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.orchestrator.config import LaunchSection, ModelSection, TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.launch import launch
from elastic_pipe.orchestrator.launch.job import (
    AUTH_C10D_BACKEND,
    LOOPBACK,
    LOOPBACK_BACKEND,
    RUN_ID_ENV,
    RendezvousOptions,
    rendezvous_options,
    resolve_run_id,
    startup_line,
    worker_environ,
    worker_environment,
)
from elastic_pipe.orchestrator.launch.rendezvous import loopback_store


def _listening(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on ``port`` (Linux /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        table = Path(f"/proc/net/{name}")
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                if width == 8:
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
                else:
                    found.add("ipv6:" + address)
    return found


def _config(**launch: object) -> TrainConfig:
    return TrainConfig(model=ModelSection(name="vit"), launch=LaunchSection(**launch))  # type: ignore[arg-type]


needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")


# --- run id -----------------------------------------------------------------------------------------------


def test_single_node_gets_a_fresh_random_run_id() -> None:
    first, second = resolve_run_id(1, environ={}), resolve_run_id(1, environ={})
    assert first != second and len(first) == 32 and int(first, 16) >= 0  # uuid4().hex
    assert "elastic-pipe" not in (first, second)


def test_given_run_id_wins_then_the_environment() -> None:
    assert resolve_run_id(2, "job-7f3a", environ={RUN_ID_ENV: "from-env"}) == "job-7f3a"
    assert resolve_run_id(2, environ={RUN_ID_ENV: "from-env"}) == "from-env"
    assert resolve_run_id(1, environ={RUN_ID_ENV: "from-env"}) == "from-env"


def test_multi_node_without_a_run_id_is_refused() -> None:
    with pytest.raises(ConfigError, match=rf"3 nodes.*--run-id.*\[launch\] run_id.*{RUN_ID_ENV}"):
        resolve_run_id(3, None, environ={})


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_run_id_is_refused(blank: str) -> None:
    with pytest.raises(ConfigError, match="must not be empty"):
        resolve_run_id(1, blank, environ={})


def test_launch_refuses_a_multi_node_job_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(nnodes=2, nproc_per_node=1, rdzv_endpoint="10.0.0.1:29400")
    saved = os.environ.pop(RUN_ID_ENV, None)
    try:
        with pytest.raises(ConfigError, match="same secret run id"):
            launch(config, print)
    finally:
        if saved is not None:
            os.environ[RUN_ID_ENV] = saved
    assert capsys.readouterr().err == ""  # refused before the first line


# --- rendezvous ----------------------------------------------------------------------------------------------


def test_single_node_rendezvous_is_loopback_only() -> None:
    options = rendezvous_options(1, "")
    assert options.backend == LOOPBACK_BACKEND
    assert options.endpoint == f"{LOOPBACK}:0" and options.local_addr == LOOPBACK
    assert options.configs["is_host"] is True


def test_multi_node_rendezvous_uses_the_shared_endpoint() -> None:
    options = rendezvous_options(2, "node0:29400")
    assert options == RendezvousOptions(AUTH_C10D_BACKEND, "node0:29400", {"timeout": 120}, None)
    with pytest.raises(ConfigError, match="rdzv_endpoint"):
        rendezvous_options(2, "")


def test_single_node_at_a_chosen_endpoint_hosts_it() -> None:
    options = rendezvous_options(1, "127.0.0.1:29500")
    assert (options.backend, options.endpoint, options.configs["is_host"]) == (
        AUTH_C10D_BACKEND,
        "127.0.0.1:29500",
        True,
    )


@needs_proc
def test_loopback_store_listens_on_loopback_only() -> None:
    store = loopback_store(timeout_s=10)
    store.set("key", "value")
    assert store.get("key") == b"value"
    assert _listening(store.port) == {LOOPBACK}  # type: ignore[attr-defined]


def _loopback_handler(run_id: str) -> Any:
    """The single-node rendezvous handler the launcher builds (``LOOPBACK_BACKEND``), for ``run_id``."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from elastic_pipe.orchestrator.launch.rendezvous import _create_loopback_handler

    params = RendezvousParameters(
        backend=LOOPBACK_BACKEND,
        endpoint=f"{LOOPBACK}:0",
        run_id=run_id,
        min_nodes=1,
        max_nodes=1,
        local_addr=LOOPBACK,
        timeout=30,
        is_host=True,
    )
    return _create_loopback_handler(params)


@needs_proc
def test_loopback_rendezvous_keeps_both_stores_on_loopback() -> None:
    handler = _loopback_handler(resolve_run_id(1, environ={}))
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        workers = info.bootstrap_store_info
        assert workers is not None
        assert workers.master_addr == LOOPBACK
        assert _listening(workers.master_port) == {LOOPBACK}  # the store the workers share
        assert _listening(info.store.underlying_store.port) == {LOOPBACK}  # type: ignore[attr-defined]  # rendezvous
    finally:
        handler.shutdown()


class _Payload:
    """What an attacker would store: unpickling it makes the directory ``marker`` (code run in the job)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (self.marker,)


def _poison_and_read(run_id: str, marker: Path) -> None:
    """Meet a single-node rendezvous under ``run_id`` as the launcher does, then write a pickled payload under
    the key torch's c10d backend used for ``run_id`` (``torch.rendezvous.<run_id>``) and under every key the
    store lists, from another client of the rendezvous store, and let the handler read its state again (torch's
    c10d backend unpickled what it read)."""
    import base64
    import pickle
    import time
    from datetime import timedelta

    import torch.distributed as dist

    handler = _loopback_handler(run_id)
    try:
        info = handler.next_rendezvous()
        port = info.store.underlying_store.port  # type: ignore[attr-defined]
        attacker = dist.TCPStore(LOOPBACK, port, is_master=False, timeout=timedelta(seconds=10))
        forged = base64.b64encode(pickle.dumps(_Payload(str(marker))))
        for key in [f"torch.rendezvous.{run_id}", *attacker.list_keys()]:  # and the rendezvous key it lists now
            attacker.set(key, forged)
        time.sleep(1.2)  # past the handler's cached state (1 s), so the next call reads the store
        handler.num_nodes_waiting()
    finally:
        handler.shutdown()


@needs_proc
def test_a_write_to_the_old_predictable_key_never_reaches_the_job(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    _poison_and_read(resolve_run_id(1, environ={}), marker)  # the job's own run id: random, never guessed
    assert not marker.exists()
    # Under the fixed run id of before the key was known, and torch's c10d backend unpickled it (the payload ran):
    # the state is now authenticated (tests/test_rendezvous_auth.py), so even a known run id runs nothing.
    _poison_and_read("elastic-pipe", marker)
    assert not marker.exists()


# --- worker threads ---------------------------------------------------------------------------------------------


def test_one_thread_per_worker_when_several_share_the_node() -> None:
    nccl = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}  # always added unless set (test_launch_failures.py)
    assert worker_environment(4, environ={}) == {"OMP_NUM_THREADS": "1", **nccl}
    assert worker_environment(1, environ={}) == nccl  # one worker may use every core
    assert worker_environment(4, environ={"OMP_NUM_THREADS": "3"}) == nccl  # the user's choice stands


def test_worker_environ_restores_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ELASTIC_PIPE_TEST_KEEP", "before")
    with worker_environ({"OMP_NUM_THREADS": "1", "ELASTIC_PIPE_TEST_KEEP": "during"}):
        assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["ELASTIC_PIPE_TEST_KEEP"] == "during"
    assert "OMP_NUM_THREADS" not in os.environ and os.environ["ELASTIC_PIPE_TEST_KEEP"] == "before"
    with pytest.raises(RuntimeError), worker_environ({"OMP_NUM_THREADS": "1"}):
        raise RuntimeError("a worker failed")
    assert "OMP_NUM_THREADS" not in os.environ


# --- first line -------------------------------------------------------------------------------------------------


def test_startup_line_names_workers_world_size_and_rendezvous() -> None:
    one = _config(nproc_per_node=4)
    assert startup_line(one, rendezvous_options(1, "")) == (
        "elastic-pipe: starting 4 workers on this node (world size 4), rendezvous on 127.0.0.1 only ..."
    )
    two = _config(nproc_per_node=2, nnodes=2, rdzv_endpoint="node0:29400")
    line = startup_line(two, rendezvous_options(2, "node0:29400"))
    assert line.startswith("elastic-pipe: starting 2 workers on this node (world size 4), rendezvous at node0:29400")
    assert "\n" not in line
