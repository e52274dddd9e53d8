"""The protocol package's exception family."""

from __future__ import annotations

from elastic_pipe._checks import Checks
from elastic_pipe.types import ElasticPipeError

__all__ = ["CHECK", "ProtocolError", "ProtocolTypeError"]


class ProtocolError(ElasticPipeError, ValueError):
    """A transition message that cannot be built, encoded or decoded.

    Decoding raises this and nothing else for any malformed input (truncated, wrong magic or version, bad
    checksum, absurd counts, values that do not fit the layout); the message says what is wrong.
    """


class ProtocolTypeError(ProtocolError, TypeError):
    """An argument of the wrong type (a string where a count belongs, ``None`` for a schedule); also a
    ``TypeError``, so callers that catch that keep working."""


#: The package's argument checks: out-of-range values raise :class:`ProtocolError`,
#: wrong types :class:`ProtocolTypeError`.
CHECK = Checks(ProtocolError, ProtocolTypeError)
