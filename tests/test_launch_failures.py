"""How a failed run reads: a worker's failure as one line naming its rank, a silent peer named within the timeout.

The pure parts (turning torch's ``ProcessFailure`` into a line, the NCCL error-handling variable, reading the ranks
out of a monitored barrier's error, which worker report names the cause, a DataLoader worker's failure on one line,
heartbeats and the launcher's watchdog) are checked directly; then a launch whose rank 1 raises, through
``launch()`` and through ``elastic-pipe train``, two gloo ranks of which one is silent at the decision point, and
through ``elastic-pipe train`` a rank raising in its share of the setup check (named with its own error, not its
peer's "Connection closed by peer") and a rank stopped with SIGSTOP (named within the timeout).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from elastic_pipe.cli import main
from elastic_pipe.groups import GroupManager, silent_ranks
from elastic_pipe.orchestrator.errors import OrchestratorError, WorkerFailedError
from elastic_pipe.orchestrator.launch.agent import describe_failure, write_failure_report
from elastic_pipe.orchestrator.launch.faults import FAULT_ACTION_ENV, FAULT_ENV
from elastic_pipe.orchestrator.launch.job import (
    NCCL_ERROR_HANDLING_ENV,
    nccl_error_handling,
    worker_environment,
)
from elastic_pipe.orchestrator.launch.worker_status import (
    STATUS_DIR_ENV,
    Heartbeat,
    Watchdog,
    first_failure,
    one_line,
    report_failure,
    reporting_failures,
)
from elastic_pipe.orchestrator.layout.executor import meet
from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
TINY = {"depth": 2, "dim": 16, "heads": 2, "mlp_dim": 32, "patch_size": 4}


class _Failure:
    """The fields of torch's ProcessFailure that describe_failure reads."""

    def __init__(self, message: Any, exitcode: int = 1) -> None:
        self.message = message
        self.exitcode = exitcode

    def signal_name(self) -> str:
        return "SIGKILL"


# --- pure parts ---------------------------------------------------------------------------------------------------


def test_a_reported_failure_is_its_exception_on_one_line() -> None:
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nOrchestratorError: peers\ndisagree\n'
    report = {"message": "OrchestratorError: peers\ndisagree", "extraInfo": {"py_callstack": tb, "timestamp": "1"}}
    assert describe_failure(_Failure(report)) == ("OrchestratorError: peers disagree", tb)


def test_a_failure_without_a_report_says_how_the_worker_died() -> None:
    docs = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    assert describe_failure(_Failure(docs, exitcode=1)) == ("exited with code 1 without an error report", None)
    assert describe_failure(_Failure("Signal 9 (SIGKILL) received by PID 7", exitcode=-9)) == (
        "killed by signal 9 (SIGKILL)",
        None,
    )


def test_worker_failed_error_is_one_line_naming_rank_and_report() -> None:
    err = WorkerFailedError(1, "OrchestratorError: no", traceback="tb", restarts=2, report="/logs/error-rank1.txt")
    assert str(err) == "rank 1 failed: OrchestratorError: no (after 2 restarts); traceback in /logs/error-rank1.txt"
    assert isinstance(err, OrchestratorError) and err.rank == 1 and err.traceback == "tb"
    assert str(WorkerFailedError(0, "exited with code 1 without an error report", traceback=None, restarts=0)) == (
        "rank 0 failed: exited with code 1 without an error report"
    )


def test_failure_report_goes_to_the_log_dir(tmp_path: Path) -> None:
    path = write_failure_report(str(tmp_path / "log"), 3, "E: x", "Traceback ...\nE: x\n")
    assert path == str(tmp_path / "log" / "error-rank3.txt")
    assert Path(path).read_text(encoding="utf-8") == "Traceback ...\nE: x\n"
    assert write_failure_report("", 3, "E: x", None) is None


def test_nccl_async_error_handling_is_on_unless_the_user_chose() -> None:
    assert nccl_error_handling({}) == {NCCL_ERROR_HANDLING_ENV: "1"}  # abort the communicator, tear down
    assert nccl_error_handling({NCCL_ERROR_HANDLING_ENV: "3"}) == {}
    assert worker_environment(1, environ={}) == {NCCL_ERROR_HANDLING_ENV: "1"}
    assert worker_environment(2, environ={NCCL_ERROR_HANDLING_ENV: "0", "OMP_NUM_THREADS": "4"}) == {}


def test_join_process_group_sets_nccl_error_handling_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from elastic_pipe.orchestrator.config import LaunchSection, ModelSection, TrainConfig
    from elastic_pipe.orchestrator.launch import process_group

    seen: dict[str, str | None] = {}
    monkeypatch.delenv(NCCL_ERROR_HANDLING_ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(process_group.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        dist,
        "init_process_group",
        lambda *a, **k: seen.update(value=process_group.os.environ.get(NCCL_ERROR_HANDLING_ENV)),
    )
    config = TrainConfig(model=ModelSection(name="vit"), launch=LaunchSection(nproc_per_node=1, backend="nccl"))
    assert process_group.join_process_group(config) is True
    assert seen == {"value": "1"}


def test_silent_ranks_are_read_from_the_barrier_error() -> None:
    assert silent_ranks("Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms") == (1, 3)
    assert silent_ranks("Rank 2 failed to pass monitoredBarrier in 2000 ms") == (2,)
    assert silent_ranks("connection reset by peer") == ()


# --- processes ----------------------------------------------------------------------------------------------------


def _silent_at_decision(ctx: RankContext) -> tuple[str, float]:
    manager = GroupManager(ctx.world_size, ctx.rank, [1], backend="gloo", timeout=2.0)
    manager.build()
    try:
        if ctx.rank == 1:
            time.sleep(5.0)  # past the timeout: the peer that hangs before the decision point
        started = time.monotonic()
        try:
            meet(manager, "the decision point before epoch 2", ctx.rank)
        except OrchestratorError as exc:
            return str(exc), time.monotonic() - started
        return "", time.monotonic() - started
    finally:
        manager.destroy()


@pytest.mark.distributed
def test_a_silent_peer_is_named_at_the_decision_point() -> None:
    (message, waited), _ = run_distributed(_silent_at_decision, 2, timeout=60.0)
    assert message.startswith("rank 0: rank 1 did not reach the decision point before epoch 2 within 2 s")
    assert "\n" not in message
    # Named once the 2 s timeout has passed (measured in the rank: process start-up under load does not count).
    assert 1.5 < waited < 10.0


def _launch_config(tmp_path: Path) -> Any:
    from elastic_pipe.orchestrator.config import config_from_tables

    return config_from_tables(
        {"model": {"name": "vit"}, "launch": {"nproc_per_node": 2}, "log": {"dir": str(tmp_path / "log")}}
    )


@pytest.mark.distributed
def test_launch_names_the_failed_rank_and_keeps_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from elastic_pipe.orchestrator.launch import launch

    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delenv("ELASTIC_PIPE_DEBUG", raising=False)
    from plug_failing import fail_on_rank_one

    with pytest.raises(WorkerFailedError) as caught:
        launch(_launch_config(tmp_path), fail_on_rank_one, 7)
    report = tmp_path / "log" / "error-rank1.txt"
    assert str(caught.value) == f"rank 1 failed: OrchestratorError: rank 1 cannot handle 7; traceback in {report}"
    assert "Traceback (most recent call last)" in report.read_text(encoding="utf-8")
    assert "py_callstack" not in capfd.readouterr().err  # torch's own report stays off stderr


def _train(
    tmp_path: Path, toml: str, capfd: pytest.CaptureFixture[str], model: str = "vit"
) -> tuple[int, list[str], str, float]:
    """``elastic-pipe train`` of a tiny ``model`` (a ViT) for one epoch with ``toml`` added; the exit code, the summary
    lines, stderr, and when it returned (``time.time()``)."""
    config = tmp_path / "run.toml"
    options = ", ".join(f"{k} = {v}" for k, v in TINY.items())
    config.write_text(
        f'[model]\nname = "{model}"\noptions = {{ {options} }}\n[train]\nepochs = 1\nglobal_batch = 32\n'
        f'[log]\ndir = "{tmp_path / "log"}"\nprogress = false\n{toml}',
        encoding="utf-8",
    )
    code = main(["train", "--config", str(config)])
    returned = time.time()
    err = capfd.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("elastic-pipe train:")], err, returned


@pytest.mark.distributed
@pytest.mark.parametrize("debug", [False, True])
def test_train_cli_failure_is_one_line_exit_1(
    debug: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", f"{PLUGINS}:{':'.join(sys.path)}")
    if debug:
        monkeypatch.setenv("ELASTIC_PIPE_DEBUG", "1")
    else:
        monkeypatch.delenv("ELASTIC_PIPE_DEBUG", raising=False)
    code, summary, err, _ = _train(tmp_path, "[launch]\nnproc_per_node = 2\n", capfd, "plug_failing:rank_one_fails")
    assert code == 1
    report = tmp_path / "log" / "error-rank1.txt"
    assert len(summary) == 1, err
    # the builder's error reaches the worker wrapped as a ConfigError naming the model
    assert summary[0].startswith("elastic-pipe train: error: rank 1 failed: ConfigError: model 'plug_failing:")
    assert summary[0].endswith(f"rank one refuses to build its model; traceback in {report}")
    assert "Traceback (most recent call last)" in report.read_text(encoding="utf-8")
    assert ("Traceback (most recent call last)" in err) is debug
    assert "py_callstack" not in err


# --- the cause, not a peer's reaction to it; a silent worker, named ----------------------------------------------

#: (case, reports as (rank, attempt, time_ns), the rank the launcher names): the earliest of the latest attempt.
REPORTS: list[tuple[str, list[tuple[int, int, int]], int | None]] = [
    ("none", [], None),
    ("one", [(1, 0, 5)], 1),
    ("the raising rank before its peer's connection error", [(0, 0, 9), (1, 0, 7)], 1),
    ("a tie goes to the lower rank", [(1, 0, 7), (0, 0, 7)], 0),
    ("a restart's reports win over the first attempt's", [(0, 0, 1), (1, 1, 9), (0, 1, 8)], 0),
]


@pytest.mark.parametrize(("case", "reports", "named"), REPORTS, ids=[c[0] for c in REPORTS])
def test_the_earliest_report_of_the_latest_attempt_names_the_rank(
    case: str, reports: list[tuple[int, int, int]], named: int | None, tmp_path: Path
) -> None:
    for rank, attempt, stamp in reports:
        record = {"rank": rank, "attempt": attempt, "time_ns": stamp, "error": f"E: {rank}", "traceback": "tb"}
        (tmp_path / f"failure-{attempt}-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    (tmp_path / "failure-0-9.json").write_bytes(b"\xff not json")  # an unreadable report is skipped
    found = first_failure(tmp_path)
    assert (found and found.rank) == named and (found is None or found.error == f"E: {named}")


def test_a_worker_reports_its_first_failure_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATUS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError), reporting_failures(), reporting_failures():
        raise ValueError("the cause\non two lines")
    report_failure(RuntimeError("Connection closed by peer"))  # what tearing down makes of it later: not kept
    found = first_failure(tmp_path)
    assert found is not None and (found.rank, found.error) == (1, "ValueError: the cause on two lines")
    assert "Traceback (most recent call last)" in found.traceback


class _Raising(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        raise RuntimeError(f"sensor {index} went offline")


def test_a_dataloader_workers_failure_is_one_line() -> None:
    loader = torch.utils.data.DataLoader(_Raising(), num_workers=1)
    with pytest.raises(RuntimeError) as caught:
        next(iter(loader))
    text = f"{type(caught.value).__name__}: {caught.value}"
    assert len(text) > 200 and text.count("\n") > 3  # torch's: the worker's whole traceback
    assert one_line(text) == "RuntimeError: sensor 0 went offline (in DataLoader worker process 0)"
    assert one_line("E: a\n  b") == "E: a b"


def test_a_heartbeat_stays_fresh_and_goes_when_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATUS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    with Heartbeat(timeout=0.5) as beat:
        assert beat.path == tmp_path / "alive-3.json"
        os.utime(beat.path, (0, 0))
        time.sleep(0.3)
        assert time.time() - beat.path.stat().st_mtime < 0.3  # touched every 0.05 s
    assert not (tmp_path / "alive-3.json").exists()


def test_the_watchdog_kills_a_silent_child_and_names_it(tmp_path: Path) -> None:
    silent = subprocess.Popen(["sleep", "60"])
    busy = subprocess.Popen(["sleep", "60"])
    try:
        for rank, proc in ((1, silent), (0, busy)):
            (tmp_path / f"alive-{rank}.json").write_text(json.dumps({"rank": rank, "pid": proc.pid}), encoding="utf-8")
        now = time.time()
        os.utime(tmp_path / "alive-0.json", (now - 1, now - 1))  # beat a second ago
        os.utime(tmp_path / "alive-1.json", (now - 9, now - 9))  # 9 s without a heartbeat
        watchdog = Watchdog(tmp_path, timeout=10.0)
        assert [(s.rank, s.pid) for s in watchdog.check(now)] == [(1, silent.pid)]
        assert silent.wait(timeout=10) == -signal.SIGKILL and busy.poll() is None
        assert watchdog.check(now) == []  # dead now: not killed twice
        message = watchdog.describe()
        assert message is not None and message.startswith("stopped responding: no sign of life for 9.0 s (limit 8 s")
    finally:
        for proc in (silent, busy):
            proc.kill()
            proc.wait()


@pytest.mark.distributed
def test_the_rank_that_raised_is_named_with_its_own_error_not_a_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # item 7 is rank 1's share of the setup check; it raises in a DataLoader worker, and rank 0, waiting for rank 1,
    # then fails too ("Connection closed by peer" once rank 1 tears down its groups)
    monkeypatch.setenv("PYTHONPATH", f"{PLUGINS}:{':'.join(sys.path)}")
    monkeypatch.syspath_prepend(str(PLUGINS))
    toml = '[data]\ndataset = "plug_data:raising_digits"\nworkers = 1\n[launch]\nnproc_per_node = 2\ntimeout = 30\n'
    code, summary, err, _ = _train(tmp_path, toml, capfd)
    report = tmp_path / "log" / "error-rank1.txt"
    assert code == 1 and summary == [
        "elastic-pipe train: error: rank 1 failed: RuntimeError: sensor 7 went offline (in DataLoader worker process 0)"
        f"; traceback in {report}"
    ], err
    assert "went offline" in report.read_text(encoding="utf-8")


@pytest.mark.distributed
def test_a_stopped_rank_is_named_within_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    timeout = 6.0
    monkeypatch.setenv(FAULT_ENV, "step:1:0:2")  # rank 1 stops (SIGSTOP) before step 2 of epoch 0
    monkeypatch.setenv(FAULT_ACTION_ENV, "stop")
    code, summary, err, returned = _train(tmp_path, f"[launch]\nnproc_per_node = 2\ntimeout = {timeout}\n", capfd)
    assert code == 1 and len(summary) == 1, err
    assert summary[0].startswith("elastic-pipe train: error: rank 1 failed: stopped responding: no sign of life"), err
    stopped = float(re.findall(r"rank 1 stops at epoch 0 step 2 \(time ([0-9.]+)\)", err)[0])
    silent_for = float(re.findall(r"no sign of life for ([0-9.]+) s", summary[0])[0])
    assert silent_for < timeout  # named after 0.8 of the timeout, before a peer's collective gives up
    # and the job ends about then: not at 2x the timeout, nor after the agent's 30 s wait for a stopped process to
    # handle SIGTERM (slack for the agent's teardown on a loaded machine)
    assert returned - stopped < 1.5 * timeout, returned - stopped


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_more_local_ranks_than_gpus_train_on_gloo_with_cuda_visible(tmp_path: Path) -> None:
    """CUDA present but one rank more than devices: ``backend = "auto"`` trains on gloo on the CPU, no device
    ordinal error (the 1-GPU machine's failure the reliability pass fixed)."""
    from elastic_pipe.orchestrator import config_from_tables, launch
    from elastic_pipe.orchestrator.worker import entry

    ranks = torch.cuda.device_count() + 1
    config = config_from_tables(
        {
            "model": {"name": "vit", "options": {"preset": "vit-tiny", "depth": 2, "dim": 16, "heads": 2}},
            "train": {"epochs": 1, "global_batch": 16 * ranks, "max_steps": 2},
            "pipeline": {"pipe_len": 1, "cache": "off"},
            "launch": {"nproc_per_node": ranks, "backend": "auto"},
            "log": {"progress": False, "dir": str(tmp_path / "log")},
        }
    )
    results = launch(config, entry, config.to_dict())
    assert sorted(results) == list(range(ranks))
    losses = results[0]["losses"]
    assert losses and all(math.isfinite(x) for x in losses)
