"""The data package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "DataError", "DataTypeError", "MissingExtraError"]


class DataError(ElasticPipeError, ValueError):
    """Bad sampler or dataset input: counts, ranks, batch sizes, states, unknown dataset names."""


class MissingExtraError(DataError, ImportError):
    """A bundled dataset needs an optional dependency that is not installed (the message names the extra)."""


class DataTypeError(DataError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`DataError`,
#: wrong types :class:`DataTypeError`.
CHECK = Checks(DataError, DataTypeError, integer="an integer")
