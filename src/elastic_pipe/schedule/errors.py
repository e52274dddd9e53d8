"""The schedule package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["MissingExtraError", "ScheduleError"]


class ScheduleError(ElasticPipeError, ValueError):
    """A schedule, its parameters or its costs are invalid (the message names the value and what was expected)."""


class MissingExtraError(ScheduleError, ImportError):
    """An optional dependency (e.g. matplotlib for Gantt charts) is not installed."""
