"""The partition package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "PartitionError", "PartitionTypeError"]


class PartitionError(ElasticPipeError, ValueError):
    """Bad input to a partition solver, cost model or compression rule, or a problem no partition solves.

    The message names the offending value and what was expected.
    """


class PartitionTypeError(PartitionError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`PartitionError`,
#: wrong types :class:`PartitionTypeError`.
CHECK = Checks(PartitionError, PartitionTypeError)
