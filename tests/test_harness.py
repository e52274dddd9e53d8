"""The multi-process test harness: real collectives, failing ranks, timeouts."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

import harness_slow_start
from elastic_pipe.testing import DistributedTestError, RankContext, run_distributed
from elastic_pipe.testing.distributed import START_ENV

pytestmark = pytest.mark.distributed


def _all_reduce(ctx: RankContext) -> list[float]:
    t = torch.tensor([float(ctx.rank), 1.0])
    dist.all_reduce(t)
    return t.tolist()


def _fail_on_rank_2(ctx: RankContext) -> int:
    if ctx.rank == 2:
        raise ValueError("rank two is broken on purpose")
    dist.barrier()
    return ctx.rank


def _rank_1_sleeps(ctx: RankContext) -> int:
    if ctx.rank == 1:
        time.sleep(600)
    dist.barrier()
    return ctx.rank


def test_all_reduce_over_four_ranks() -> None:
    assert run_distributed(_all_reduce, 4) == [[6.0, 4.0]] * 4


def _threads(ctx: RankContext) -> int:
    return torch.get_num_threads()


def test_ranks_run_the_thread_count_asked_for() -> None:
    # One thread each by default, however many cores the machine has: ten test workers of four ranks each would
    # otherwise run 40 x cores threads (a 16-core machine slowed ranks from seconds to minutes that way).
    assert run_distributed(_threads, 2) == [1, 1]
    assert run_distributed(_threads, 2, env={"OMP_NUM_THREADS": "3"}) == [3, 3]


def test_failing_rank_surfaces_its_traceback() -> None:
    with pytest.raises(DistributedTestError, match="rank two is broken on purpose"):
        run_distributed(_fail_on_rank_2, 3, timeout=30)


def test_silent_rank_times_out_instead_of_hanging() -> None:
    start = time.monotonic()
    with pytest.raises(DistributedTestError, match="timed out after 8s") as raised:
        run_distributed(_rank_1_sleeps, 2, timeout=8)
    assert time.monotonic() - start < 300  # start-up is not counted, but the sleeper (600 s) is not waited for
    # the error says where the silent rank was: its stacks, down to the sleep
    message = str(raised.value)
    assert "--- rank 1 (still running), its stacks ---" in message
    assert "in _rank_1_sleeps" in message.split("--- rank 1 (still running)")[1]


def test_rejects_empty_world() -> None:
    with pytest.raises(DistributedTestError, match="world_size"):
        run_distributed(_all_reduce, 0)


def test_start_up_is_outside_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each rank takes 4 s to start (its import of the function's module sleeps); the run itself has 3 s.
    monkeypatch.setenv(harness_slow_start.DELAY_ENV, "4")
    assert run_distributed(harness_slow_start.rank_number, 2, timeout=3) == [0, 1]


def test_ranks_that_do_not_start_in_time_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(harness_slow_start.DELAY_ENV, "30")
    start = time.monotonic()
    with pytest.raises(DistributedTestError, match=r"ranks \[0, 1\] did not start within 2s"):
        run_distributed(harness_slow_start.rank_number, 2, timeout=60, startup_timeout=2)
    assert time.monotonic() - start < 20  # the sleeping ranks are ended, not waited for


def _environment(ctx: RankContext) -> tuple[str | None, str | None, int]:
    return os.environ.get("ELASTIC_PIPE_TEST_MARK"), os.environ.get("CUDA_VISIBLE_DEVICES"), torch.get_num_threads()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ranks_start_either_way_with_the_test_processs_environment(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Ranks forked from the fork server (``ELASTIC_PIPE_TEST_START=forkserver``) as well as spawned ones see the
    environment of the test process at the call (the server's own was fixed when it started), one torch thread,
    and a module that reads the environment as it is imported sees it too (its import sleeps as asked)."""
    monkeypatch.setenv(START_ENV, method)
    monkeypatch.setenv("ELASTIC_PIPE_TEST_MARK", f"set by the test for {method}")
    assert run_distributed(_environment, 2) == [(f"set by the test for {method}", "", 1)] * 2
    monkeypatch.setenv(harness_slow_start.DELAY_ENV, "3")
    start = time.monotonic()
    assert run_distributed(harness_slow_start.rank_number, 2, timeout=2) == [0, 1]  # start-up outside the deadline
    assert time.monotonic() - start >= 3  # the module's import slept: the rank had the variable before it


def test_an_unknown_start_method_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(START_ENV, "fork")
    with pytest.raises(DistributedTestError, match="must be 'forkserver' or 'spawn', got 'fork'"):
        run_distributed(_all_reduce, 1)
