"""The partition package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["PartitionError"]


class PartitionError(ElasticPipeError, ValueError):
    """Bad input to a partition solver, cost model or compression rule, or a problem no partition solves.

    The message names the offending value and what was expected.
    """
