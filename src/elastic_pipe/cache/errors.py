"""The cache package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "CacheDirError", "CacheError", "CacheTypeError"]


class CacheError(ElasticPipeError, ValueError):
    """Bad cache configuration or input (budgets, ids, shapes, boundaries, augmentation), or a clash with a
    shared segment that another process created with a different layout."""


class CacheDirError(CacheError):
    """A tier's directory cannot be created or written; names the tier and the path.

    Attributes:
        tier: ``"host"`` or ``"disk"``.
        path: the directory.
    """

    def __init__(self, tier: str, path: str, reason: str) -> None:
        super().__init__(f"the cache's {tier} directory {path!r} is not writable: {reason}")
        self.tier = tier
        self.path = path


class CacheTypeError(CacheError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`CacheError`,
#: wrong types :class:`CacheTypeError`.
CHECK = Checks(CacheError, CacheTypeError)
