"""Run a function in N processes joined by a gloo process group on loopback.

Why a helper: multi-process tests are where hangs and leaked ports come from. This one

* picks the rendezvous port safely: the parent process opens the ``TCPStore`` itself on port 0 (the kernel picks a
  free port and the store holds it), so no other process can grab the port between "find" and "bind";
* gives every collective a real timeout (``timeout`` seconds), and the whole run a deadline that starts once every
  rank has started (spawning and importing torch can take a minute on a loaded machine; that is not the test's
  time): the ranks report in, then all begin together; start-up has its own, generous limit;
* destroys the process group in ``finally`` on every rank;
* turns a failing rank into a :class:`DistributedTestError` carrying that rank's traceback, and terminates the
  other ranks instead of waiting for them; a run that times out carries the stacks of the ranks still running.

The function must be importable by a child process (a module-level function) and receives a
:class:`RankContext` followed by ``args``. Return values come back to the parent, indexed by rank.

Each rank is a fresh interpreter (``multiprocessing``'s ``spawn``), which imports torch and the orchestrator again
(about 5 s of CPU a rank on the 2-core CI machine). ``ELASTIC_PIPE_TEST_START=forkserver`` forks the ranks from a
*fork server* that has imported them once (:data:`PRELOAD`) instead: on this machine three files of multi-process
tests took 35 s instead of 85 s; one run in seven of them failed a timing-sensitive test (the silent-peer barrier
of ``tests/test_groups_distributed.py``), not yet explained, so it is not the default. Either way each rank takes
the test process's environment as it is at the call, before it imports the function's module (a fork server's
rank would otherwise have the server's, ``CUDA_VISIBLE_DEVICES`` included).

Example::

    def _sum(ctx: RankContext) -> float:
        t = torch.tensor([float(ctx.rank)])
        torch.distributed.all_reduce(t)
        return t.item()

    assert run_distributed(_sum, world_size=4) == [6.0, 6.0, 6.0, 6.0]
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import importlib
import multiprocessing as mp
import os
import queue
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from elastic_pipe.types import ElasticPipeError

__all__ = ["DistributedTestError", "RankContext", "run_distributed", "run_tasks"]

_HOST = "127.0.0.1"
#: Seconds to keep collecting reports from other ranks after the first failure.
_FAILURE_GRACE_S = 3.0
#: Default seconds allowed for every rank to start (start, import), before the run's own deadline begins.
STARTUP_TIMEOUT_S = 120.0
#: Seconds the ranks get to write their stacks when a run times out.
_STACK_DUMP_S = 1.0
#: Modules the fork server imports once, before it forks any rank.
PRELOAD = ["torch", "torch.distributed", "elastic_pipe.orchestrator"]
#: Environment variable choosing how ranks start: ``spawn`` (the default) or ``forkserver``.
START_ENV = "ELASTIC_PIPE_TEST_START"


def _start_context() -> Any:
    """The multiprocessing context the ranks start from (see the module docstring)."""
    method = os.environ.get(START_ENV, "spawn")
    if method not in ("forkserver", "spawn"):
        raise DistributedTestError(f"{START_ENV} must be 'forkserver' or 'spawn', got {method!r}")
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(PRELOAD)
    return context


class DistributedTestError(ElasticPipeError, RuntimeError):
    """A rank failed, timed out, or died without reporting."""


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about the run it belongs to."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    timeout: float


@dataclass(frozen=True)
class _Channels:
    """How the ranks and the test process talk: results back, "started" back, "go" (or "abort") out."""

    results: mp.Queue[tuple[int, bool, Any]]
    started: mp.Queue[int]
    go: Event
    abort: Event
    #: Directory where each rank writes its threads' stacks when the test process sends it ``SIGUSR1``.
    stacks: str

    def close(self) -> None:
        self.results.close()
        self.started.close()


def _by_name(fn: Callable[..., Any]) -> Callable[..., Any] | tuple[str, str]:
    """How ``fn`` travels to a rank: by module and name, so that the rank imports its module only once it has the
    test process's environment (a fork server's rank starts with the server's, and a module may read the
    environment as it is imported); a function of a script (``__main__``) travels as itself, which
    ``multiprocessing`` resolves through the script it runs again in the rank."""
    if fn.__module__ == "__main__":
        return fn
    return (fn.__module__, fn.__qualname__)


def _resolve(target: Callable[..., Any] | tuple[str, str]) -> Callable[..., Any]:
    if callable(target):
        return target
    value: Any = importlib.import_module(target[0])
    for part in target[1].split("."):
        value = getattr(value, part)
    return value  # type: ignore[no-any-return]


def _child(
    target: Callable[..., Any] | tuple[str, str],
    ctx: RankContext,
    args: tuple[Any, ...],
    channels: _Channels,
    env: dict[str, str],
) -> None:
    os.environ.clear()  # exactly the test process's environment at the call (see run_distributed)
    os.environ.update(env)
    if threads := env.get("OMP_NUM_THREADS"):
        # torch read the variable when this process imported it, before the update: size its pool as asked
        torch.set_num_threads(int(threads))
    fn = _resolve(target)  # its module's import is part of this rank's start
    parent = os.getppid()
    stacks = open(os.path.join(channels.stacks, f"rank{ctx.rank}.txt"), "w")  # noqa: SIM115 - open until exit
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    channels.started.put(ctx.rank)  # imports are done: this rank has started
    while not channels.go.wait(timeout=1.0):
        if os.getppid() != parent:  # the test process is gone: nobody will say go
            raise SystemExit(1)
    if channels.abort.is_set():  # another rank never started: the run will not happen
        raise SystemExit(1)
    results = channels.results
    os.environ.update(
        {
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size),
            "LOCAL_RANK": str(ctx.rank),
            "LOCAL_WORLD_SIZE": str(ctx.world_size),
        }
    )
    timeout = datetime.timedelta(seconds=ctx.timeout)
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            ctx.master_addr, ctx.master_port, ctx.world_size, is_master=False, timeout=timeout
        )
        dist.init_process_group("gloo", store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
        value = fn(ctx, *args)
    except BaseException:
        # Report first: tearing down the group can block while peers wait in a collective (they are terminated).
        results.put((ctx.rank, False, traceback.format_exc()))
        _destroy_group()
        raise SystemExit(1) from None
    try:
        _destroy_group()
    except BaseException:
        results.put((ctx.rank, False, traceback.format_exc()))
        raise SystemExit(1) from None
    results.put((ctx.rank, True, value))


def run_tasks(ctx: RankContext, tasks: Mapping[Hashable, tuple[Callable[..., Any], tuple[Any, ...]]]) -> dict[Any, Any]:
    """Run several rank functions one after the other in one job: ``run_distributed(run_tasks, n, tasks)``.

    Starting the ranks (an interpreter, torch, the orchestrator) often costs more than what a test's ranks do, so
    tests of one module that need jobs of the same size can share one (a module-scoped fixture). Each task is
    ``fn(ctx, *args)`` and builds what it needs, as in a job of its own; a task that patches a library function
    puts it back before it returns, since the next task runs in the same process.

    Returns:
        Per key of ``tasks``, what its function returned on this rank.
    """
    return {key: fn(ctx, *args) for key, (fn, args) in tasks.items()}


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` gloo ranks and return the per-rank results.

    Args:
        fn: a module-level function (the ranks import it by name).
        world_size: number of processes, >= 1.
        *args: extra positional arguments for ``fn`` (must be picklable: they are sent to the ranks).
        timeout: seconds allowed for every collective and for the whole run, counted from the moment every rank
            has started.
        env: extra environment variables for the children (e.g. thread counts). ``OMP_NUM_THREADS`` (default 1)
            also sizes each rank's torch thread pool (the variable alone would come too late: the rank has
            imported torch by then).
        startup_timeout: seconds allowed for every rank to start (start and import), before ``timeout`` runs.

    Returns:
        ``fn``'s return values, indexed by rank.

    Raises:
        DistributedTestError: a rank raised (its traceback is in the message), died, or the run (or its start-up)
            timed out.
    """
    if world_size < 1:
        raise DistributedTestError(f"world_size must be >= 1, got {world_size}")
    # the whole environment: a rank forked from the fork server has the server's, not this process's
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    store = dist.TCPStore(  # type: ignore[attr-defined]
        _HOST,
        0,
        world_size + 1,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    port = store.port
    ctx_mp = _start_context()
    stacks = tempfile.mkdtemp(prefix="elastic_pipe-test-stacks-")
    channels = _Channels(ctx_mp.Queue(), ctx_mp.Queue(), ctx_mp.Event(), ctx_mp.Event(), stacks)
    results = channels.results
    procs = [
        ctx_mp.Process(
            target=_child,
            args=(_by_name(fn), RankContext(r, world_size, _HOST, port, timeout), args, channels, child_env),
            name=f"rank{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    values: dict[int, Any] = {}
    failures: dict[int, str] = {}
    try:
        _wait_until_started(procs, channels.started, startup_timeout)
        channels.go.set()
        deadline = time.monotonic() + timeout
        while len(values) + len(failures) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DistributedTestError(
                    f"timed out after {timeout:.0f}s; ranks that finished: {sorted(values)}"
                    + _describe(failures)
                    + _stacks_of_the_rest(procs, set(values) | set(failures), stacks)
                )
            try:
                rank, ok, payload = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in failures]
                if dead and not failures:
                    # give a dying rank a moment to flush its traceback into the queue
                    try:
                        rank, ok, payload = results.get(timeout=2.0)
                    except queue.Empty:
                        codes = {i: procs[i].exitcode for i in dead}
                        raise DistributedTestError(f"ranks died without reporting: {codes}") from None
                else:
                    continue
            if ok:
                values[rank] = payload
            else:
                failures[rank] = payload
                # One failure is enough to fail the run; collect what the other ranks report within a short
                # grace period, since the first report is often a peer's "connection closed", not the cause.
                _drain(results, failures, values, world_size, grace=_FAILURE_GRACE_S)
                break
        if failures:
            raise DistributedTestError(f"{len(failures)} rank(s) failed" + _describe(failures))
    finally:
        if not channels.go.is_set():  # start-up failed: the ranks waiting to begin end instead
            channels.abort.set()
            channels.go.set()
        for p in procs:
            p.join(timeout=5.0 if not failures else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
        channels.close()
        shutil.rmtree(stacks, ignore_errors=True)
        del store
    return [values[r] for r in range(world_size)]


def _wait_until_started(procs: list[Any], started: mp.Queue[int], limit: float) -> None:
    """Return once every rank has reported that it started; raise if one dies first or ``limit`` runs out."""
    end = time.monotonic() + limit
    ready: set[int] = set()
    while len(ready) < len(procs):
        left = end - time.monotonic()
        if left <= 0:
            late = sorted(set(range(len(procs))) - ready)
            raise DistributedTestError(f"ranks {late} did not start within {limit:.0f}s")
        try:
            ready.add(started.get(timeout=min(left, 0.5)))
        except queue.Empty:
            dead = {i: p.exitcode for i, p in enumerate(procs) if p.exitcode is not None and i not in ready}
            if dead:
                raise DistributedTestError(f"ranks died while starting: {dead}") from None


def _drain(
    results: mp.Queue[tuple[int, bool, Any]],
    failures: dict[int, str],
    values: dict[int, Any],
    world_size: int,
    grace: float,
) -> None:
    end = time.monotonic() + grace
    while len(values) + len(failures) < world_size and (left := end - time.monotonic()) > 0:
        try:
            rank, ok, payload = results.get(timeout=left)
        except queue.Empty:
            return
        (values if ok else failures)[rank] = payload


def _stacks_of_the_rest(procs: list[Any], reported: set[int], stacks: str, lines: int = 40) -> str:
    """Where the ranks that have not reported are: each writes its threads' stacks on ``SIGUSR1``; the last
    ``lines`` lines of each (the main thread comes last) go into the error."""
    waiting = [i for i, p in enumerate(procs) if i not in reported and p.is_alive()]
    for i in waiting:
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[i].pid, signal.SIGUSR1)
    time.sleep(_STACK_DUMP_S)
    out = []
    for i in waiting:
        with contextlib.suppress(OSError):
            text = Path(stacks, f"rank{i}.txt").read_text().splitlines()
            out.append(f"\n--- rank {i} (still running), its stacks ---\n" + "\n".join(text[-lines:]))
    return "".join(out)


def _describe(failures: dict[int, str]) -> str:
    return "".join(f"\n--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items()))
