"""The schedule package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "MissingExtraError", "ScheduleError", "ScheduleTypeError"]


class ScheduleError(ElasticPipeError, ValueError):
    """A schedule, its parameters or its costs are invalid (the message names the value and what was expected)."""


class MissingExtraError(ScheduleError, ImportError):
    """An optional dependency (e.g. matplotlib for Gantt charts) is not installed."""


class ScheduleTypeError(ScheduleError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`ScheduleError`,
#: wrong types :class:`ScheduleTypeError`.
CHECK = Checks(ScheduleError, ScheduleTypeError, integer="an integer")
