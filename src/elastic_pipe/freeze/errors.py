"""The freeze package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "FreezeError", "FreezeTypeError"]


class FreezeError(ElasticPipeError, ValueError):
    """Bad input to a freeze policy, a statistics object, or a freeze request.

    Messages name the offending value and what was expected.
    """


class FreezeTypeError(FreezeError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`FreezeError`,
#: wrong types :class:`FreezeTypeError`.
CHECK = Checks(FreezeError, FreezeTypeError, integer="an integer")
