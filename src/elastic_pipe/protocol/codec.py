"""The v1 binary codec of :class:`~elastic_pipe.protocol.message.TransitionMessage`.

Layout (all fields little-endian, fixed width; offsets in bytes)::

    header   0  magic         4s   b"EPTM"
             4  version       u16  1
             6  flags         u16  bit 0: grad_norms present (so None and () stay distinct)
             8  body_length   u32  bytes between the header and the checksum
    body    12  epoch         u64
            20  step          u64
            28  frozen        u32
            32  pipe_len      u32
            36  microbatches  u32
            40  max_cost      f64
            48  n_boundaries  u32  must equal pipe_len + 1
            52  n_changed     u32
            56  n_grad_norms  u32
            60  boundaries    n_boundaries x u32
                changed_ranks n_changed x u32
                grad_norms    n_grad_norms x f64
    trailer     crc32         u32  zlib.crc32 of header and body

Why this shape: the message crosses process boundaries, so decoding must never execute anything (no pickle) and
never trust the sender. The decoder checks the total size against a fixed ceiling, the length prefix against the
bytes actually present, the checksum, and every count against both its maximum and the remaining bytes before it
reads an array, so a hostile or corrupted buffer costs at most its own size in memory.
"""

from __future__ import annotations

import struct
import zlib

from elastic_pipe.protocol.errors import ProtocolError
from elastic_pipe.protocol.message import MAX_GRAD_NORMS, MAX_PIPE_LEN, MAX_RANKS, TransitionMessage

__all__ = ["MAGIC", "MAX_MESSAGE_BYTES", "VERSION", "decode", "encode"]

MAGIC = b"EPTM"
VERSION = 1
_FLAG_GRAD_NORMS = 1
_KNOWN_FLAGS = _FLAG_GRAD_NORMS
_HEADER = struct.Struct("<4sHHI")
_FIXED = struct.Struct("<QQIIIdIII")
_CRC = struct.Struct("<I")
_U32 = 4
_F64 = 8
#: The largest well-formed message: every count at its maximum. Anything longer is rejected before parsing.
MAX_MESSAGE_BYTES = (
    _HEADER.size + _FIXED.size + (MAX_PIPE_LEN + 1) * _U32 + MAX_RANKS * _U32 + MAX_GRAD_NORMS * _F64 + _CRC.size
)


def encode(msg: TransitionMessage) -> bytes:
    """Encode a message in the v1 binary format.

    Args:
        msg: the message (already validated by its constructor).

    Returns:
        The encoded bytes: header, body, CRC32.

    Raises:
        ProtocolError: ``msg`` is not a :class:`TransitionMessage`.
    """
    if not isinstance(msg, TransitionMessage):
        raise ProtocolError(f"encode expects a TransitionMessage, got {type(msg).__name__}")
    norms = msg.grad_norms if msg.grad_norms is not None else ()
    body = b"".join(
        (
            _FIXED.pack(
                msg.epoch,
                msg.step,
                msg.frozen,
                msg.pipe_len,
                msg.microbatches,
                float(msg.max_cost_at_start),
                len(msg.boundaries),
                len(msg.changed_ranks),
                len(norms),
            ),
            struct.pack(f"<{len(msg.boundaries)}I", *msg.boundaries),
            struct.pack(f"<{len(msg.changed_ranks)}I", *msg.changed_ranks),
            struct.pack(f"<{len(norms)}d", *(float(g) for g in norms)),
        )
    )
    flags = _FLAG_GRAD_NORMS if msg.grad_norms is not None else 0
    head_body = _HEADER.pack(MAGIC, VERSION, flags, len(body)) + body
    return head_body + _CRC.pack(zlib.crc32(head_body))


def decode(data: bytes | bytearray | memoryview) -> TransitionMessage:
    """Decode a v1 message, checking everything before trusting it.

    Args:
        data: the bytes produced by :func:`encode`.

    Returns:
        The decoded, validated message.

    Raises:
        ProtocolError: on any malformed input, with what is wrong: not bytes, too short or too long, wrong magic,
            unsupported version, a length prefix that disagrees with the bytes present, a CRC mismatch, unknown
            flags, counts beyond their maxima or the buffer, or field values the message rejects.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"decode expects bytes, got {type(data).__name__}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            f"message has {size} bytes, more than the largest valid message ({MAX_MESSAGE_BYTES} bytes)"
        )
    buf = data.tobytes() if isinstance(data, memoryview) else bytes(data)
    smallest = _HEADER.size + _FIXED.size + _CRC.size
    if len(buf) < smallest:
        raise ProtocolError(f"message truncated: {len(buf)} bytes, a v1 message has at least {smallest}")
    magic, version, flags, body_length = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ProtocolError(f"wrong magic {magic!r}, expected {MAGIC!r} (not an elastic_pipe transition message)")
    if version != VERSION:
        raise ProtocolError(f"unsupported message version {version}, this decoder reads version {VERSION}")
    present = len(buf) - _HEADER.size - _CRC.size
    if body_length != present:
        raise ProtocolError(
            f"length prefix says the body has {body_length} bytes but {present} are present "
            "(truncated message or trailing bytes)"
        )
    (expected_crc,) = _CRC.unpack_from(buf, len(buf) - _CRC.size)
    actual_crc = zlib.crc32(buf[: len(buf) - _CRC.size])
    if actual_crc != expected_crc:
        raise ProtocolError(f"CRC32 mismatch: message says {expected_crc:#010x}, content gives {actual_crc:#010x}")
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"unknown flag bits {flags & ~_KNOWN_FLAGS:#06x} (known: {_KNOWN_FLAGS:#06x})")
    (epoch, step, frozen, pipe_len, microbatches, max_cost, n_bounds, n_changed, n_norms) = _FIXED.unpack_from(
        buf, _HEADER.size
    )
    if n_bounds != pipe_len + 1:
        raise ProtocolError(f"boundary count {n_bounds} does not match pipe_len + 1 = {pipe_len + 1}")
    if pipe_len > MAX_PIPE_LEN:
        raise ProtocolError(f"pipe_len {pipe_len} exceeds the maximum {MAX_PIPE_LEN}")
    if n_changed > MAX_RANKS:
        raise ProtocolError(f"changed-rank count {n_changed} exceeds the maximum {MAX_RANKS}")
    if n_norms > MAX_GRAD_NORMS:
        raise ProtocolError(f"gradient-norm count {n_norms} exceeds the maximum {MAX_GRAD_NORMS}")
    if n_norms and not flags & _FLAG_GRAD_NORMS:
        raise ProtocolError(f"{n_norms} gradient norms present but the grad-norms flag is not set")
    needed = _FIXED.size + (n_bounds + n_changed) * _U32 + n_norms * _F64
    if needed != body_length:
        raise ProtocolError(f"counts need a body of {needed} bytes but it has {body_length}")
    offset = _HEADER.size + _FIXED.size
    boundaries = struct.unpack_from(f"<{n_bounds}I", buf, offset)
    offset += n_bounds * _U32
    changed = struct.unpack_from(f"<{n_changed}I", buf, offset)
    offset += n_changed * _U32
    norms = struct.unpack_from(f"<{n_norms}d", buf, offset)
    return TransitionMessage(
        epoch=epoch,
        step=step,
        frozen=frozen,
        pipe_len=pipe_len,
        boundaries=boundaries,
        microbatches=microbatches,
        max_cost_at_start=max_cost,
        changed_ranks=changed,
        grad_norms=norms if flags & _FLAG_GRAD_NORMS else None,
    )
