"""The planner's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["PlannerError"]


class PlannerError(ElasticPipeError, ValueError):
    """Bad planner input (unknown model, impossible cluster, a job that fits nowhere), naming the bad value."""
