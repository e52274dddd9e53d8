"""Test helpers users can rely on too: run a function in N gloo processes on loopback; count the work a block of
training code does (forwards per sub-layer, cache writes, dataset reads, bytes copied between ranks)."""

from __future__ import annotations

from elastic_pipe.testing.distributed import DistributedTestError, RankContext, run_distributed, run_tasks
from elastic_pipe.testing.work import CountedDataset, PartCount, WorkCount, count_work

__all__ = [
    "CountedDataset",
    "DistributedTestError",
    "PartCount",
    "RankContext",
    "WorkCount",
    "count_work",
    "run_distributed",
    "run_tasks",
]
