"""The cache package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["CacheError"]


class CacheError(ElasticPipeError, ValueError):
    """Bad cache configuration or input (budgets, ids, shapes, boundaries, augmentation), or a clash with a
    shared segment that another process created with a different layout."""
