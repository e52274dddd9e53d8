"""What a worker tells its launcher beside torch's own channels: its failure, time-stamped before it tears anything
down, and that it is alive.

torch's agent learns of a failed worker from the error file the worker writes as its exception leaves the process,
stamped to the second. By then the worker has torn down its process groups, its peers' collectives have failed
with "Connection closed by peer" in the same second, and the peer's error could be reported instead of the cause.
So a worker of :func:`~elastic_pipe.orchestrator.launch.launch` also writes its failure at the moment it catches
it (:func:`report_failure`, before the trainer closes anything), stamped to the nanosecond, and the launcher reports
the earliest (:func:`first_failure`).

A worker that stops (SIGSTOP, a deadlock holding the interpreter) raises nothing: its peers' collectives time out,
and each peer can only say that it waited. So every worker keeps a heartbeat file fresh from a thread
(:class:`Heartbeat`); the launcher's :class:`Watchdog` names a worker whose file went stale for
:data:`SILENT_FRACTION` of ``[launch] timeout`` (before its peers' collectives time out) and kills it, so the
agent stops the job at once instead of waiting for the stopped process to handle SIGTERM.

Both go to a private directory the launcher creates (mode 0700) and names in :data:`STATUS_DIR_ENV`; the files are
JSON, never unpickled. Without that variable (a worker started by another launcher) nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from elastic_pipe.orchestrator.errors import one_line

__all__ = [
    "STATUS_DIR_ENV",
    "FailureReport",
    "Heartbeat",
    "Silent",
    "Watchdog",
    "first_failure",
    "report_failure",
    "reporting_failures",
]

#: The environment variable naming the launcher's status directory.
STATUS_DIR_ENV = "ELASTIC_PIPE_STATUS_DIR"
#: A worker whose heartbeat is older than this fraction of ``[launch] timeout`` is silent: its peers' collectives
#: (which wait the whole timeout) have not given up yet, so the silent worker, not a waiting peer, is named.
SILENT_FRACTION = 0.8
#: Longest interval between two heartbeats, in seconds (shorter for short timeouts: a tenth of the timeout).
_BEAT_S = 1.0


@dataclass(frozen=True, slots=True)
class FailureReport:
    """A worker's failure as it caught it.

    Attributes:
        rank: the worker's global rank.
        attempt: the restart attempt it belonged to (0 first).
        time_ns: when it caught the exception (``time.time_ns()``).
        error: ``"Type: message"`` on one line (:func:`one_line`).
        traceback: the full traceback.
    """

    rank: int
    attempt: int
    time_ns: int
    error: str
    traceback: str


def _rank_and_attempt() -> tuple[int, int]:
    return int(os.environ.get("RANK", "-1")), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def report_failure(exc: BaseException) -> None:
    """Record ``exc`` as this worker's failure in the launcher's status directory, unless one is recorded already
    (the innermost catch is the earliest). Call it before tearing down process groups. No-op without
    :data:`STATUS_DIR_ENV`; never raises (the exception being reported matters more)."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory or isinstance(exc, KeyboardInterrupt | SystemExit):
        return
    rank, attempt = _rank_and_attempt()
    path = Path(directory) / f"failure-{attempt}-{rank}.json"
    if path.exists():
        return
    record = {
        "rank": rank,
        "attempt": attempt,
        "time_ns": time.time_ns(),
        "error": one_line(f"{type(exc).__name__}: {exc}"),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    with contextlib.suppress(OSError):
        _write_json(path, record)


@contextlib.contextmanager
def reporting_failures() -> Iterator[None]:
    """Report (:func:`report_failure`) any exception leaving the block, then let it go on."""
    try:
        yield
    except BaseException as exc:
        report_failure(exc)
        raise


def first_failure(directory: str | Path) -> FailureReport | None:
    """The earliest failure of the latest attempt that reported any, or ``None`` (unreadable reports are skipped)."""
    reports = []
    for path in Path(directory).glob("failure-*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            reports.append(
                FailureReport(
                    int(data["rank"]),
                    int(data["attempt"]),
                    int(data["time_ns"]),
                    str(data["error"]),
                    str(data["traceback"]),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not reports:
        return None
    latest = max(r.attempt for r in reports)
    return min((r for r in reports if r.attempt == latest), key=lambda r: (r.time_ns, r.rank))


class Heartbeat:
    """A daemon thread that keeps ``alive-<rank>.json`` in the status directory fresh while the block runs.

    Args:
        timeout: ``[launch] timeout``; the file is touched every tenth of it (at most every second).
    """

    def __init__(self, timeout: float) -> None:
        directory = os.environ.get(STATUS_DIR_ENV)
        rank, attempt = _rank_and_attempt()
        self.path = Path(directory) / f"alive-{rank}.json" if directory else None
        self.record = {"rank": rank, "attempt": attempt, "pid": os.getpid()}
        self.interval = min(_BEAT_S, timeout / 10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="elastic-pipe-heartbeat", daemon=True)

    def _beat(self) -> None:
        assert self.path is not None  # started only with a directory
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def __enter__(self) -> Heartbeat:
        if self.path is not None:
            with contextlib.suppress(OSError):
                _write_json(self.path, self.record)
                self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.path is not None:
            self.path.unlink(missing_ok=True)  # a worker that finished (or reported its failure) is not silent


@dataclass(frozen=True, slots=True)
class Silent:
    """A worker the :class:`Watchdog` found silent and killed: its rank, pid and seconds without a heartbeat."""

    rank: int
    pid: int
    seconds: float


def _child_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) child of this process (Linux ``/proc``; elsewhere: never)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except (OSError, ValueError):
        return False
    fields = stat.rsplit(")", 1)[-1].split()  # after "(comm)": state, ppid, ...
    return len(fields) > 1 and fields[0] not in ("Z", "X") and int(fields[1]) == os.getpid()


class Watchdog:
    """The launcher's thread that kills a worker whose heartbeat went stale (see the module docstring).

    Args:
        directory: the status directory.
        timeout: ``[launch] timeout``; a worker is silent after :data:`SILENT_FRACTION` of it.
    """

    def __init__(self, directory: str | Path, timeout: float) -> None:
        self.directory = Path(directory)
        self.timeout = timeout
        self.limit = SILENT_FRACTION * timeout
        #: The workers found silent, in order.
        self.silent: list[Silent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="elastic-pipe-watchdog", daemon=True)

    def check(self, now: float) -> list[Silent]:
        """Kill every live child worker whose heartbeat is older than the limit at ``now``; returns them."""
        found = []
        for path in self.directory.glob("alive-*.json"):
            try:
                age = now - path.stat().st_mtime
                data = json.loads(path.read_text(encoding="utf-8"))
                rank, pid = int(data["rank"]), int(data["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if age <= self.limit or any(s.pid == pid for s in self.silent) or not _child_alive(pid):
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            found.append(Silent(rank, pid, age))
        self.silent += found
        return found

    def _watch(self) -> None:
        while not self._stop.wait(min(0.25, self.timeout / 20)):
            self.check(time.time())

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def describe(self) -> str | None:
        """The first silent worker as the launch's one-line error (``None``: none was silent)."""
        if not self.silent:
            return None
        s = self.silent[0]
        return (
            f"stopped responding: no sign of life for {s.seconds:.1f} s (limit {self.limit:g} s, "
            f"{SILENT_FRACTION:g} of [launch] timeout = {self.timeout:g} s): stopped, deadlocked or starved; "
            "the launcher killed it"
        )
