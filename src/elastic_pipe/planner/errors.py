"""The planner's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "PlannerError", "PlannerTypeError"]


class PlannerError(ElasticPipeError, ValueError):
    """Bad planner input (unknown model, impossible cluster, a job that fits nowhere), naming the bad value."""


class PlannerTypeError(PlannerError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`PlannerError`,
#: wrong types :class:`PlannerTypeError`.
CHECK = Checks(PlannerError, PlannerTypeError)
