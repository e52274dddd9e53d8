"""No other process can make a job run its code through the rendezvous store (issue #44, item 1).

torch's dynamic rendezvous unpickles the state it reads from its store, and a TCPStore answers ``list_keys`` and
``set`` to any client: a local user who finds the port could write a pickle under the rendezvous key. Here an
attacker lists every key it can and overwrites each with pickled payloads (raw, base64, base64 behind a fake tag,
and garbage); the payload would make a directory if it ever ran. Checked on the backend over a plain store, on the
single-node handler the launcher builds, and on a whole ``elastic-pipe train`` run with an attacker process (as
``nobody`` when this runs as root and the interpreter is reachable to it). Then the secret: a multi-node job needs
one of at least 128 bits, from a file (mode 600) or the environment, and refuses a shorter one.
"""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.orchestrator.config import LaunchSection, ModelSection, TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.launch import launch
from elastic_pipe.orchestrator.launch.job import LOOPBACK, LOOPBACK_BACKEND
from elastic_pipe.orchestrator.launch.rendezvous import AuthenticatedBackend
from elastic_pipe.orchestrator.launch.secret import (
    MIN_SECRET_BITS,
    SECRET_ENV,
    SECRET_FILE_ENV,
    fresh_secret,
    read_secret,
    secret_for,
)

needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class _Payload:
    """What an attacker stores: unpickling it makes the directory ``marker`` (code run in the job)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (self.marker,)


def _forgeries(marker: Path) -> list[bytes]:
    """Every shape of value an attacker might write: each unpickles to the payload if anything unpickles it."""
    bits = pickle.dumps(_Payload(str(marker)))
    return [
        base64.b64encode(bits),  # what torch's c10d backend stores (base64 of the pickled state)
        bits,  # raw
        base64.b64encode(b"\0" * 32 + bits),  # behind a fake tag
        base64.b64encode(os.urandom(32) + bits),
        b"not base64 !!",
        b"",
        b"-",  # the empty key's sentinel, once a state was written
        base64.b64encode(b"short"),
    ]


# --- the backend ------------------------------------------------------------------------------------------------


def _hash_store() -> Any:
    import torch.distributed as dist

    return dist.HashStore()  # type: ignore[attr-defined]


def test_a_sealed_state_round_trips_and_binds_the_secret_and_run_id() -> None:
    store, secret = _hash_store(), fresh_secret()
    backend = AuthenticatedBackend(store, "job", secret, "x")
    assert backend.get_state() is None  # nothing written yet
    written = backend.set_state(b"state-1")
    assert written is not None and written[0] == b"state-1" and written[2] is True
    assert backend.get_state() == (b"state-1", written[1])
    # another secret, or the same secret under another run id, does not open it
    assert AuthenticatedBackend(store, "job", fresh_secret(), "x").open(written[1]) is None
    assert AuthenticatedBackend(store, "job2", secret, "x").open(written[1]) is None
    assert backend.open(written[1]) == b"state-1"


def test_a_forged_state_is_never_handed_on_and_the_next_write_replaces_it(tmp_path: Path) -> None:
    store = _hash_store()
    backend = AuthenticatedBackend(store, "job", fresh_secret(), "x")
    first = backend.set_state(b"good")
    assert first is not None
    key = "elastic_pipe.rendezvous.job"
    for i, forged in enumerate(_forgeries(tmp_path / "ran")):
        store.set(key, forged)
        got = backend.get_state()
        assert got is not None and got[0] == b"good", forged  # the last authenticated state
        assert got[1] == forged  # the token: the next write replaces the forged value
        result = backend.set_state(b"next", got[1])
        assert result is not None and result[0] == b"next" and result[2] is True
        first = backend.set_state(b"good", result[1])
        assert first is not None and first[2] is True
        assert backend.forged == i + 1
    assert not (tmp_path / "ran").exists()


def test_a_forged_state_before_any_good_one_reads_as_an_empty_rendezvous(tmp_path: Path) -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    store = _hash_store()
    backend = AuthenticatedBackend(store, "job", fresh_secret(), "x")
    store.set("elastic_pipe.rendezvous.job", base64.b64encode(pickle.dumps(_Payload(str(tmp_path / "ran")))))
    got = backend.get_state()
    assert got is not None
    state = pickle.loads(got[0])  # of our own making
    assert isinstance(state, _RendezvousState) and not state.participants
    assert not (tmp_path / "ran").exists()


# --- the single-node handler the launcher builds -------------------------------------------------------------------


def _loopback_handler(run_id: str) -> Any:
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


def _overwrite_every_key(port: int, forged: bytes) -> list[str]:
    """Connect to the store at ``port`` as a client, list its keys and write ``forged`` under each."""
    import torch.distributed as dist

    attacker = dist.TCPStore(LOOPBACK, port, is_master=False, timeout=timedelta(seconds=10))  # type: ignore[attr-defined]
    keys: list[str] = list(attacker.list_keys())
    for key in keys:
        attacker.set(key, forged)
    return keys


@needs_proc
@pytest.mark.parametrize("which", range(4))
def test_the_single_node_handler_never_unpickles_what_another_client_wrote(which: int, tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    handler = _loopback_handler("job-under-attack")
    try:
        info = handler.next_rendezvous()
        port = info.store.underlying_store.port
        keys = _overwrite_every_key(port, _forgeries(marker)[which])
        assert any("rendezvous" in key for key in keys), keys  # the state's key was listed and overwritten
        time.sleep(1.2)  # past the handler's cached state (1 s), so the next call reads the store
        assert handler.num_nodes_waiting() == 0  # the handler still answers, from its authenticated state
        keys = _overwrite_every_key(port, _forgeries(marker)[which])
        time.sleep(1.2)
        handler.num_nodes_waiting()
    finally:
        handler.shutdown()
    assert not marker.exists()


# --- a whole job under attack --------------------------------------------------------------------------------------

#: The attacker: given only the ports (lines on its stdin), it lists the keys of every store there and overwrites
#: each with a pickled payload, over and over, until the job ends (its parent kills it). It imports torch before
#: the job starts, so it writes as soon as the job's stores exist. Runs with ``-c`` and talks through pipes, so
#: that ``nobody`` needs no access to the test's files.
_ATTACKER = """
import base64, os, pickle, sys, threading, time
from datetime import timedelta
import torch.distributed as dist

class P:
    def __reduce__(self):
        return os.mkdir, (sys.argv[1],)

bits = pickle.dumps(P())
values = [base64.b64encode(bits), bits, base64.b64encode(os.urandom(32) + bits)]
ports = set()

def read_ports():
    for line in sys.stdin:
        ports.update(int(p) for p in line.split())

threading.Thread(target=read_ports, daemon=True).start()
print("ready", flush=True)
stores, writes, rounds = {}, 0, 0
while True:
    for port in sorted(ports):
        try:
            store = stores.get(port) or dist.TCPStore("127.0.0.1", port, is_master=False,
                                                      timeout=timedelta(seconds=2))
            stores[port] = store
            for key in store.list_keys():  # mostly what torch's backend stores (base64), now and then the others
                store.set(key, values[0] if rounds % 5 else values[rounds // 5 % len(values)])
                writes += 1
        except Exception:
            stores.pop(port, None)
    rounds += 1
    print(writes, flush=True)
    time.sleep(0.02)
"""


def _listening_inodes() -> dict[str, int]:
    """Socket inode -> port of every TCP socket listening on 127.0.0.1."""
    found: dict[str, int] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, port_hex = fields[1].split(":")
        if fields[3] == "0A" and address == "0100007F":  # LISTEN on 127.0.0.1
            found[fields[9]] = int(port_hex, 16)
    return found


def _ports_of(pid: int) -> set[int]:
    """The loopback ports process ``pid`` listens on (its sockets, through /proc/PID/fd)."""
    listening = _listening_inodes()
    ports: set[int] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                ports.add(listening[target[8:-1]])
    except OSError:
        pass
    return ports


def _attacker_user() -> int | None:
    """``nobody``'s uid when this runs as root and ``nobody`` can import torch with this interpreter, else None
    (the attacker then runs as this user, which can do at least as much)."""
    if os.geteuid() != 0:
        return None
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import torch.distributed"], user=65534, capture_output=True, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return 65534 if probe.returncode == 0 else None


@needs_proc
@pytest.mark.distributed
def test_a_local_attacker_writing_under_every_key_never_runs_code_in_a_train_job(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    os.chmod(tmp_path, 0o777)  # so that the job (root) may make it whoever the attacker is
    config = tmp_path / "run.toml"
    config.write_text(
        '[model]\nname = "vit"\noptions = { depth = 2, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }\n'
        "[train]\nepochs = 2\nglobal_batch = 32\nmax_steps = 3\n"
        '[pipeline]\npipe_len = 1\ncache = "off"\n'
        "[launch]\nnproc_per_node = 2\nmax_restarts = 0\ntimeout = 30.0\n"
        f'[log]\nprogress = false\ndir = "{tmp_path / "log"}"\n',
        encoding="utf-8",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    counts = tmp_path / "writes.txt"
    attacked: set[int] = set()
    job: subprocess.Popen[bytes] | None = None
    with counts.open("wb") as count_file:
        attacker = subprocess.Popen(
            [sys.executable, "-c", _ATTACKER, str(marker)],
            stdin=subprocess.PIPE,
            stdout=count_file,
            stderr=subprocess.DEVNULL,
            env={**env, "PYTHONPATH": ""},
            user=_attacker_user(),
        )
        try:
            deadline = time.monotonic() + 60
            while b"ready" not in counts.read_bytes() and attacker.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            job = subprocess.Popen(
                [sys.executable, "-m", "elastic_pipe", "train", "--config", str(config), "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
            deadline = time.monotonic() + 120
            while job.poll() is None and time.monotonic() < deadline:
                ports = _ports_of(job.pid)  # the agent's two stores: the rendezvous's and the workers'
                if ports and not ports <= attacked:
                    attacked |= ports
                    assert attacker.stdin is not None
                    attacker.stdin.write((" ".join(map(str, sorted(ports))) + "\n").encode())
                    attacker.stdin.flush()
                time.sleep(0.02)
            _, err = job.communicate(timeout=240)
        finally:
            if job is not None and job.poll() is None:
                job.kill()
                job.communicate()
            attacker.kill()
            attacker.communicate()  # closes its stdin
    writes = counts.read_text().split()[1:]  # after "ready"
    assert attacked, "the job's stores were never found"
    assert writes and int(writes[-1]) > 0, "the attacker never wrote"  # it did list keys and overwrite them
    assert not marker.exists(), "the attacker's payload ran in the job"
    lines = [line for line in err.decode().splitlines() if line.startswith("elastic-pipe train:")]
    text = err.decode()
    assert "Fatal Python error" not in text and "Traceback" not in text, text[-3000:]  # no crash, no raw trace
    if job.returncode != 0:  # the job may fail (its workers' values were overwritten), with one line
        assert job.returncode in (1, 2) and len(lines) == 1, text[-3000:]
        # a worker reading a forged value, or the agent reading torch's unauthenticated rank assignment
        assert "another process wrote to" in lines[0] or "Expecting value" in lines[0], lines[0]


# --- the multi-node secret -----------------------------------------------------------------------------------------


def _config(**launch: object) -> TrainConfig:
    return TrainConfig(model=ModelSection(name="vit"), launch=LaunchSection(**launch))  # type: ignore[arg-type]


def test_a_multi_node_job_without_a_secret_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)
    config = _config(nnodes=2, nproc_per_node=1, rdzv_endpoint="10.0.0.1:29400", run_id="job")
    with pytest.raises(ConfigError, match=rf"2 nodes.*secret of at least 128 bits.*--rdzv-secret-file.*{SECRET_ENV}"):
        launch(config, print)
    assert capsys.readouterr().err == ""  # refused before the first line


@pytest.mark.parametrize("text", ["", "abc", "0" * 31, "00" * 15, "zz" * 16, "ab" * 16 + "g"])
def test_a_short_or_malformed_secret_is_refused(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=rf"rendezvous secret from \${SECRET_ENV}"):
        read_secret(None, {SECRET_ENV: text})
    config = _config(nnodes=2, nproc_per_node=1, rdzv_endpoint="10.0.0.1:29400", run_id="job")
    monkeypatch.setenv(SECRET_ENV, text)
    with pytest.raises(ConfigError, match="rendezvous secret"):
        launch(config, print, quiet=True)


def test_a_secret_of_128_bits_or_more_is_read_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert MIN_SECRET_BITS == 128
    assert read_secret(None, {SECRET_ENV: " " + "ab" * 16 + "\n"}) == bytes.fromhex("ab" * 16)
    path = tmp_path / "secret"
    path.write_text("cd" * 32 + "\n", encoding="ascii")
    path.chmod(0o600)
    assert read_secret(str(path), {SECRET_ENV: "ab" * 16}) == bytes.fromhex("cd" * 32)  # the file wins
    assert read_secret(None, {SECRET_FILE_ENV: str(path), SECRET_ENV: "ab" * 16}) == bytes.fromhex("cd" * 32)
    assert read_secret(None, {}) is None


def test_a_secret_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("cd" * 16, encoding="ascii")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"open to other users \(mode 644\).*chmod 600"):
        read_secret(str(path), {})
    with pytest.raises(ConfigError, match="cannot read the rendezvous secret file"):
        read_secret(str(tmp_path / "absent"), {})
    with pytest.raises(ConfigError, match="not a regular file"):
        read_secret(str(tmp_path), {})


def test_a_single_node_draws_a_fresh_secret_per_job_and_several_nodes_need_one() -> None:
    first, second = secret_for(1, None, ""), secret_for(1, None, "")
    assert first != second and len(first) * 8 == 256
    given = bytes.fromhex("ab" * 16)
    assert secret_for(2, given, "h:1") == given
    with pytest.raises(ConfigError, match="2 nodes, rendezvous at h:1"):
        secret_for(2, None, "h:1")


def test_an_agent_failing_on_forged_store_values_says_so_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import torch.distributed.launcher.api as launcher_api

    from elastic_pipe.orchestrator.errors import OrchestratorError
    from elastic_pipe.orchestrator.launch import rendezvous

    def agent(run_id: str, forged: int) -> Any:
        def launcher(config: Any, entrypoint: Any) -> Any:
            def run(*args: Any) -> Any:
                rendezvous._FORGED[run_id] = forged  # what the backend counts when it meets a forged state
                json.loads("")  # torch's agent reading a rank assignment another process overwrote

            return run

        return launcher

    config = _config(nproc_per_node=1, run_id="job-a")
    monkeypatch.setattr(launcher_api, "elastic_launch", agent("job-a", 3))
    with pytest.raises(OrchestratorError) as caught:
        launch(config, print, quiet=True)
    assert str(caught.value).startswith("the elastic agent failed (JSONDecodeError: Expecting value")
    assert str(caught.value).endswith("another process wrote to this job's stores (3 forged rendezvous states ignored)")
    assert "\n" not in str(caught.value) and rendezvous.forged_states("job-a") == 0  # forgotten after the launch
    monkeypatch.setattr(launcher_api, "elastic_launch", agent("job-a", 0))
    with pytest.raises(json.JSONDecodeError):  # no forgery seen: the agent's own error, as it was
        launch(config, print, quiet=True)
