"""The groups package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["GroupsError"]


class GroupsError(ElasticPipeError, ValueError):
    """A rank layout that cannot exist, or a process-group operation that failed or timed out.

    Bad input (a pipeline length that does not divide the world size, a rank out of range) and distributed
    failures (a peer that never answers within the timeout) both raise this, with the values involved.
    """
