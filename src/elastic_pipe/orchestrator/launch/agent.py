"""Start the processes: torchrun's elastic launcher underneath ``elastic-pipe train`` and ``elastic-pipe demo``.

One agent per node starts ``nproc_per_node`` workers, joins the other nodes' agents through a c10d rendezvous and
restarts the whole group (up to ``max_restarts`` times) when a worker fails; the workers then resume from the last
checkpoint.

What :func:`launch` adds to a plain ``elastic_launch``:

* what the job is, decided before anything starts (:mod:`.job`): its run id, its rendezvous (loopback only for a
  single node), the environment its workers inherit (one OpenMP thread each, NCCL's asynchronous error handling);
* an authenticated rendezvous (:mod:`.rendezvous`): the agents' state carries an HMAC tag under the job's secret
  and nothing without a valid one is unpickled, so a process that reaches the store cannot run code in the job; a
  single node draws a fresh secret per launch, several nodes must share one of at least 128 bits given in a file
  or the environment (:func:`~elastic_pipe.orchestrator.launch.secret.read_secret`), never on a command line; the
  workers tag what they write to their own store under a key derived from it (:mod:`.worker_store`);
* a failed worker as one line (:func:`describe_failure`): its rank and its exception, the full traceback in
  ``[log] dir``/error-rank<N>.txt, and torch's own multi-line failure report kept off stderr; the rank named is the
  one that raised first, from the reports the workers write before tearing anything down, and a worker that stops
  responding is named and killed after 0.8 of ``[launch] timeout`` (:mod:`.worker_status`);
* a first line on stderr saying what starts (:func:`~elastic_pipe.orchestrator.launch.job.startup_line`), before
  the seconds the workers take to import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

from elastic_pipe.orchestrator.errors import OrchestratorError, WorkerFailedError, one_line
from elastic_pipe.orchestrator.launch.job import (
    rendezvous_options,
    resolve_run_id,
    startup_line,
    worker_environ,
    worker_environment,
)
from elastic_pipe.orchestrator.launch.rendezvous import forged_states, forget_secret, register_backends
from elastic_pipe.orchestrator.launch.secret import read_secret, secret_for
from elastic_pipe.orchestrator.launch.worker_status import (
    STATUS_DIR_ENV,
    FailureReport,
    Watchdog,
    first_failure,
)
from elastic_pipe.orchestrator.launch.worker_store import STORE_KEY_ENV, store_key
from elastic_pipe.types import ElasticPipeError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["describe_failure", "launch", "write_failure_report"]

#: Set to anything non-empty: a failed run prints its full traceback on stderr too (the CLI's convention).
DEBUG_ENV = "ELASTIC_PIPE_DEBUG"
#: torch's loggers that print a failed worker's traceback (and the sibling it stops) on the agent's stderr.
_FAILURE_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")

#: What a worker's entry point returns (rank 0's result comes back to the launcher).
R = TypeVar("R")


class _Failure(Protocol):
    """What is read of a failed worker (torch's ``ProcessFailure``; its ``message`` is a dict when the worker left an
    error report, though torch declares a string)."""

    @property
    def message(self) -> object: ...

    @property
    def timestamp(self) -> int: ...


def describe_failure(failure: _Failure) -> tuple[str, str | None]:
    """A failed worker (torch's ``ProcessFailure``) as ``(one-line error, traceback or None)``.

    A worker that raised leaves an error report: its ``message`` is then a dict whose ``"message"`` is
    ``"Type: text"`` and whose ``"extraInfo"`` holds the traceback (``"py_callstack"``). A worker that died
    without one (``os._exit``, a signal) has a string message; the exit code or signal says what happened.
    """
    message = failure.message
    traceback: str | None = None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        if isinstance(extra, dict) and isinstance(extra.get("py_callstack"), str):
            traceback = extra["py_callstack"]
        message = message.get("message", "")
    text = one_line(str(message))
    exitcode = int(getattr(failure, "exitcode", 0))
    if traceback is None and exitcode < 0:
        name = failure.signal_name() if hasattr(failure, "signal_name") else "?"
        text = f"killed by signal {-exitcode} ({name})"
    elif traceback is None and (not text or text.startswith("To enable traceback")):
        text = f"exited with code {exitcode} without an error report"
    return text, traceback


def write_failure_report(log_dir: str, rank: int, error: str, traceback: str | None) -> str | None:
    """Write a failed rank's traceback to ``log_dir``/error-rank<rank>.txt; returns the path (None: not written)."""
    if not log_dir:
        return None
    path = os.path.join(log_dir, f"error-rank{rank}.txt")
    try:
        os.makedirs(log_dir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(traceback if traceback is not None else error + "\n")
    except OSError:
        return None  # the one-line error still says what failed
    return path


@contextlib.contextmanager
def _quiet_failure_logs(enabled: bool) -> Iterator[None]:
    """Keep torch's multi-line failure report off stderr while ``enabled`` (our one line replaces it)."""
    loggers = [logging.getLogger(name) for name in _FAILURE_LOGGERS] if enabled else []
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, saved, strict=True):
            logger.setLevel(level)


def launch(
    config: TrainConfig,
    entrypoint: Callable[..., R],
    *args: object,
    run_id: str | None = None,
    quiet: bool = False,
    secret_file: str | None = None,
) -> dict[int, R]:
    """Run ``entrypoint(*args)`` on this node's ``nproc_per_node`` ranks under the elastic agent.

    Args:
        config: its ``[launch]`` section gives ``nnodes``, ``nproc_per_node``, ``max_restarts`` and
            ``rdzv_endpoint`` and ``run_id``.
        entrypoint: a module-level function (workers import it by name).
        *args: picklable arguments.
        run_id: the job id shared by every node's agent (see
            :func:`~elastic_pipe.orchestrator.launch.job.resolve_run_id`; required for several nodes, through this
            argument, ``config.launch.run_id``, or :data:`~elastic_pipe.orchestrator.launch.job.RUN_ID_ENV`).
        quiet: leave out the first line on stderr.
        secret_file: a file holding the rendezvous secret (hex, at least 128 bits; see
            :func:`~elastic_pipe.orchestrator.launch.secret.read_secret` for the environment variables). Required,
            one way or the other, for several nodes; a single node draws a fresh one.

    Returns:
        Each local rank's return value.

    Raises:
        ConfigError: a multi-node job without an endpoint, a run id or a secret, or a secret that is unreadable,
            open to other users, not hex or shorter than 128 bits (before anything starts).
        WorkerFailedError: a worker failed after all restarts: one line naming the first failed rank and its
            exception; its traceback is on the error and in ``[log] dir``/error-rank<N>.txt.
    """
    section = config.launch
    configured = section.run_id or None
    job_id = resolve_run_id(section.nnodes, run_id if run_id is not None else configured)
    options = rendezvous_options(section.nnodes, section.rdzv_endpoint)
    secret = secret_for(section.nnodes, read_secret(secret_file), options.endpoint)
    if not quiet:
        sys.stderr.write(startup_line(config, options) + "\n")
        sys.stderr.flush()

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: PLC0415
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch  # noqa: PLC0415

    register_backends(job_id, secret)
    launch_config = LaunchConfig(
        min_nodes=section.nnodes,
        max_nodes=section.nnodes,
        nproc_per_node=section.nproc_per_node,
        run_id=job_id,
        rdzv_endpoint=options.endpoint,
        rdzv_backend=options.backend,
        rdzv_configs=dict(options.configs),
        max_restarts=section.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        local_addr=options.local_addr,
    )
    status = tempfile.mkdtemp(prefix="elastic-pipe-status-")  # private (0700): the workers' reports, heartbeats
    try:
        environ = {**worker_environment(section.nproc_per_node), STORE_KEY_ENV: store_key(secret).hex()}
        with (
            worker_environ({**environ, STATUS_DIR_ENV: status}),
            _quiet_failure_logs(not os.environ.get(DEBUG_ENV)),
            Watchdog(status, config.launch.timeout) as watchdog,
        ):
            result: dict[int, R] = elastic_launch(launch_config, entrypoint)(*args)
    except ChildFailedError as exc:
        raise _worker_failed(config, exc.failures, watchdog, first_failure(status)) from None
    except (RuntimeError, ValueError, TimeoutError) as exc:  # the agent itself (rendezvous, rank assignment)
        if isinstance(exc, ElasticPipeError) or not forged_states(job_id):
            raise
        # torch's agent keeps its rank assignment (JSON) and barrier counters in the store unauthenticated: when
        # another process wrote there, what fails is the agent's reading of it. Say so, on one line.
        text = one_line(f"{type(exc).__name__}: {exc}")
        raise OrchestratorError(
            f"the elastic agent failed ({text}): another process wrote to this job's stores "
            f"({forged_states(job_id)} forged rendezvous states ignored)"
        ) from exc
    finally:
        forget_secret(job_id)
        shutil.rmtree(status, ignore_errors=True)
    return result


def _worker_failed(
    config: TrainConfig, failures: Mapping[int, _Failure], watchdog: Watchdog, reported: FailureReport | None
) -> WorkerFailedError:
    """The launch's one-line error: a worker the watchdog found silent, else the earliest failure a worker
    reported when it caught it, else the earliest failure torch's agent saw (among simultaneous ones, one that left
    a report: the others were stopped by it)."""
    restarts = config.launch.max_restarts
    silent = watchdog.describe()
    if silent is not None:
        rank, error, traceback = watchdog.silent[0].rank, silent, None
    elif reported is not None:
        rank, error, traceback = reported.rank, reported.error, reported.traceback
    elif failures:
        rank = min(failures, key=lambda r: (failures[r].timestamp, isinstance(failures[r].message, str), r))
        error, traceback = describe_failure(failures[rank])
    else:
        return WorkerFailedError(-1, "the workers failed without a report", traceback=None, restarts=restarts)
    report = write_failure_report(config.log.dir, rank, error, traceback)
    return WorkerFailedError(rank, error, traceback=traceback, restarts=restarts, report=report)
