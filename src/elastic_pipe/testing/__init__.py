"""Test helpers users can rely on too: run a function in N gloo processes on loopback."""

from __future__ import annotations

from elastic_pipe.testing.distributed import DistributedTestError, RankContext, run_distributed, run_tasks

__all__ = ["DistributedTestError", "RankContext", "run_distributed", "run_tasks"]
