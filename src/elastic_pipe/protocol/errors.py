"""The protocol package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["ProtocolError"]


class ProtocolError(ElasticPipeError, ValueError):
    """A transition message that cannot be built, encoded or decoded.

    Decoding raises this and nothing else for any malformed input (truncated, wrong magic or version, bad
    checksum, absurd counts, values that do not fit the layout); the message says what is wrong.
    """
