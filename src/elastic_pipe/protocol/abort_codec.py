"""The body of an :class:`~elastic_pipe.protocol.abort.AbortMessage` inside the shared frame (kind ``b"EPAB"``).

Body layout (little-endian; offsets from the start of the message)::

    12  rank        u32
    16  reason_len  u16  at most MAX_REASON_BYTES
    18  reason      reason_len bytes of UTF-8, one printable line

The decoder reads the length, checks it against its maximum and the bytes present, decodes strict UTF-8 and lets
the dataclass check the line (no control characters, not blank).
"""

from __future__ import annotations

import struct

from elastic_pipe.protocol.abort import MAX_REASON_BYTES, AbortMessage
from elastic_pipe.protocol.errors import ProtocolError
from elastic_pipe.protocol.frame import FRAME_BYTES, Frame, Kind

__all__ = ["ABORT_KIND", "decode_abort_body", "encode_abort_body"]

_FIXED = struct.Struct("<IH")
ABORT_KIND = Kind("AbortMessage", b"EPAB", FRAME_BYTES + _FIXED.size + MAX_REASON_BYTES)


def encode_abort_body(msg: AbortMessage) -> bytes:
    """The body bytes of ``msg`` (the frame goes around them)."""
    reason = msg.reason.encode("utf-8")
    return _FIXED.pack(msg.rank, len(reason)) + reason


def decode_abort_body(frame: Frame) -> AbortMessage:
    """Read an abort from a checked frame.

    Raises:
        ProtocolError: a reason length beyond its maximum or the body, a reason that is not UTF-8 or not one
            printable line, trailing bytes.
    """
    body = frame.reader()
    rank, n = body.unpack(_FIXED, "rank and reason length")
    if n > MAX_REASON_BYTES:
        raise ProtocolError(f"abort reason length {n} exceeds the maximum {MAX_REASON_BYTES}")
    raw = body.raw(n, "reason")
    body.finish()
    try:
        reason = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"abort reason is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    return AbortMessage(rank, reason)
