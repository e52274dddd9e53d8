"""The freeze package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["FreezeError"]


class FreezeError(ElasticPipeError, ValueError):
    """Bad input to a freeze policy, a statistics object, or a freeze request.

    Messages name the offending value and what was expected.
    """
