"""The data package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["DataError", "MissingExtraError"]


class DataError(ElasticPipeError, ValueError):
    """Bad sampler or dataset input: counts, ranks, batch sizes, states, unknown dataset names."""


class MissingExtraError(DataError, ImportError):
    """A bundled dataset needs an optional dependency that is not installed (the message names the extra)."""
