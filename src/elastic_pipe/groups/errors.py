"""The groups package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "BarrierTimeoutError", "GroupsError", "GroupsTypeError"]


class GroupsError(ElasticPipeError, ValueError):
    """A rank layout that cannot exist, or a process-group operation that failed or timed out.

    Bad input (a pipeline length that does not divide the world size, a rank out of range) and distributed
    failures (a peer that never answers within the timeout) both raise this, with the values involved.
    """


class BarrierTimeoutError(GroupsError):
    """Some rank did not reach a barrier within the timeout.

    Attributes:
        silent: the ranks that did not arrive, as gloo's monitored barrier names them on rank 0 (empty on the other
            ranks, which learn only that rank 0 did not release them).
    """

    def __init__(self, message: str, silent: tuple[int, ...]) -> None:
        super().__init__(message)
        self.silent = silent


class GroupsTypeError(GroupsError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`GroupsError`,
#: wrong types :class:`GroupsTypeError`.
CHECK = Checks(GroupsError, GroupsTypeError)
