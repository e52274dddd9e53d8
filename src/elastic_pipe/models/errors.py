"""The models package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "ModelError", "ModelTypeError"]


class ModelError(ElasticPipeError, ValueError):
    """A model, configuration or adapter input is not what the models package expects.

    Messages name the bad value and what was expected (e.g. an unknown preset lists the known ones).
    """


class ModelTypeError(ModelError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`ModelError`,
#: wrong types :class:`ModelTypeError`.
CHECK = Checks(ModelError, ModelTypeError)
