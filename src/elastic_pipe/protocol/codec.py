"""The binary codec of the control messages, and the body of a transition message.

:func:`encode` writes any of the three kinds (:class:`~elastic_pipe.protocol.message.TransitionMessage`,
:class:`~elastic_pipe.protocol.abort.AbortMessage`,
:class:`~elastic_pipe.protocol.optimizer_state.OptimizerStateHeader`) in the shared frame of
:mod:`elastic_pipe.protocol.frame`; :func:`decode_any` reads any of them, :func:`decode` one expected kind (a
transition message unless told otherwise) and refuses the others with a ProtocolError that names what arrived,
an abort's rank and reason included.

Layout of a transition message (all fields little-endian, fixed width; offsets in bytes)::

    header   0  magic         4s   b"EPTM"
             4  version       u16  2 (written; 1 is still read)
             6  flags         u16  bit 0: grad_norms present (so None and () stay distinct)
             8  body_length   u32  bytes between the header and the checksum
    body    12  epoch         u64
            20  step          u64
            28  frozen        u32
            32  pipe_len      u32
            36  microbatches  u32
            40  max_cost      f64
            48  n_boundaries  u32  must equal pipe_len * virtual + 1
            52  n_changed     u32
            56  n_grad_norms  u32
            60  virtual       u32  stages per rank (version 2 only)
            64  boundaries    n_boundaries x u32
                changed_ranks n_changed x u32
                grad_norms    n_grad_norms x f64
    trailer     crc32         u32  zlib.crc32 of header and body

Version 1 is the same without ``virtual`` (the arrays start at offset 60); it decodes as ``virtual = 1``, so a
message from a sender that predates virtual stages still reads as the one-stage-per-rank layout it meant.

Why this shape: the message crosses process boundaries, so decoding must never execute anything (no pickle) and
never trust the sender. The decoder checks the total size against a fixed ceiling, the length prefix against the
bytes actually present, the checksum, and every count against both its maximum and the remaining bytes before it
reads an array, so a hostile or corrupted buffer costs at most its own size in memory.
"""

from __future__ import annotations

import struct
from typing import TypeAlias, TypeVar, overload

from elastic_pipe.protocol.abort import AbortMessage
from elastic_pipe.protocol.abort_codec import ABORT_KIND, decode_abort_body, encode_abort_body
from elastic_pipe.protocol.errors import ProtocolError, ProtocolTypeError
from elastic_pipe.protocol.frame import FRAME_BYTES, VERSION, Buffer, Frame, Kind, read_frame, write_frame
from elastic_pipe.protocol.message import MAX_GRAD_NORMS, MAX_PIPE_LEN, MAX_RANKS, TransitionMessage
from elastic_pipe.protocol.optimizer_state import OptimizerStateHeader
from elastic_pipe.protocol.state_codec import STATE_KIND, decode_state_body, encode_state_body

__all__ = [
    "MAGIC",
    "MAX_MESSAGE_BYTES",
    "TRANSITION_VERSION",
    "VERSION",
    "ControlMessage",
    "decode",
    "decode_any",
    "encode",
]

#: Any message that travels on the control group.
ControlMessage: TypeAlias = TransitionMessage | AbortMessage | OptimizerStateHeader
_M = TypeVar("_M", TransitionMessage, AbortMessage, OptimizerStateHeader)

MAGIC = b"EPTM"
_FLAG_GRAD_NORMS = 1
#: The transition body's layout version this codec writes (it reads every version up to it).
TRANSITION_VERSION = 2
#: The fixed fields of each version: version 2 appends ``virtual``.
_FIXED = {1: struct.Struct("<QQIIIdIII"), 2: struct.Struct("<QQIIIdIIII")}
_U32 = 4
_F64 = 8
#: The largest well-formed transition message: every count at its maximum. It is also the largest message of any
#: kind, so nothing longer is parsed at all.
MAX_MESSAGE_BYTES = (
    FRAME_BYTES + _FIXED[TRANSITION_VERSION].size + (MAX_PIPE_LEN + 1 + MAX_RANKS) * _U32 + MAX_GRAD_NORMS * _F64
)
_TRANSITION_KIND = Kind("TransitionMessage", MAGIC, MAX_MESSAGE_BYTES, _FLAG_GRAD_NORMS, tuple(_FIXED))
_KINDS = {k.magic: k for k in (_TRANSITION_KIND, ABORT_KIND, STATE_KIND)}
_EXPECTABLE: tuple[type[ControlMessage], ...] = (TransitionMessage, AbortMessage, OptimizerStateHeader)


def _encode_transition_body(msg: TransitionMessage) -> bytes:
    norms = msg.grad_norms if msg.grad_norms is not None else ()
    return b"".join(
        (
            _FIXED[TRANSITION_VERSION].pack(
                msg.epoch,
                msg.step,
                msg.frozen,
                msg.pipe_len,
                msg.microbatches,
                float(msg.max_cost_at_start),
                len(msg.boundaries),
                len(msg.changed_ranks),
                len(norms),
                msg.virtual,
            ),
            struct.pack(f"<{len(msg.boundaries)}I", *msg.boundaries),
            struct.pack(f"<{len(msg.changed_ranks)}I", *msg.changed_ranks),
            struct.pack(f"<{len(norms)}d", *(float(g) for g in norms)),
        )
    )


def _decode_transition_body(frame: Frame) -> TransitionMessage:
    body = frame.reader()
    fixed = _FIXED[frame.version]
    (epoch, step, frozen, pipe_len, microbatches, max_cost, n_bounds, n_changed, n_norms, *rest) = body.unpack(
        fixed, "fixed fields"
    )
    virtual = rest[0] if rest else 1
    if n_bounds != pipe_len * virtual + 1:
        raise ProtocolError(
            f"boundary count {n_bounds} does not match pipe_len * virtual + 1 = {pipe_len * virtual + 1}"
        )
    if pipe_len * virtual > MAX_PIPE_LEN:
        raise ProtocolError(f"pipe_len {pipe_len} x virtual {virtual} exceeds the maximum {MAX_PIPE_LEN} stages")
    if n_changed > MAX_RANKS:
        raise ProtocolError(f"changed-rank count {n_changed} exceeds the maximum {MAX_RANKS}")
    if n_norms > MAX_GRAD_NORMS:
        raise ProtocolError(f"gradient-norm count {n_norms} exceeds the maximum {MAX_GRAD_NORMS}")
    has_norms = bool(frame.flags & _FLAG_GRAD_NORMS)
    if n_norms and not has_norms:
        raise ProtocolError(f"{n_norms} gradient norms present but the grad-norms flag is not set")
    needed = fixed.size + (n_bounds + n_changed) * _U32 + n_norms * _F64
    body_length = len(frame.buf) - FRAME_BYTES
    if needed != body_length:
        raise ProtocolError(f"counts need a body of {needed} bytes but it has {body_length}")
    boundaries = body.array("I", n_bounds, "boundaries")
    changed = body.array("I", n_changed, "changed ranks")
    norms = body.array("d", n_norms, "gradient norms")
    body.finish()
    return TransitionMessage(
        epoch=epoch,
        step=step,
        frozen=frozen,
        pipe_len=pipe_len,
        boundaries=boundaries,
        microbatches=microbatches,
        max_cost_at_start=max_cost,
        changed_ranks=changed,
        grad_norms=norms if has_norms else None,
        virtual=virtual,
    )


def encode(msg: ControlMessage) -> bytes:
    """Encode a control message in its kind's newest binary format (a transition at :data:`TRANSITION_VERSION`).

    Args:
        msg: a :class:`TransitionMessage`, :class:`AbortMessage` or :class:`OptimizerStateHeader` (already
            validated by its constructor).

    Returns:
        The encoded bytes: header (with the kind's magic), body, CRC32.

    Raises:
        ProtocolError: ``msg`` is none of the three kinds.
    """
    if isinstance(msg, TransitionMessage):
        flags = _FLAG_GRAD_NORMS if msg.grad_norms is not None else 0
        return write_frame(_TRANSITION_KIND, flags, _encode_transition_body(msg))
    if isinstance(msg, AbortMessage):
        return write_frame(ABORT_KIND, 0, encode_abort_body(msg))
    if isinstance(msg, OptimizerStateHeader):
        return write_frame(STATE_KIND, 0, encode_state_body(msg))
    raise ProtocolTypeError(
        f"encode: msg must be a TransitionMessage, AbortMessage or OptimizerStateHeader, got {type(msg).__name__}"
    )


def decode_any(data: Buffer) -> ControlMessage:
    """Decode a message of any kind, checking everything before trusting it.

    The receiver of a control-group broadcast tells the kinds apart with ``isinstance``; the kind tag (magic)
    is inside the checksum, so corruption cannot change it.

    Args:
        data: the bytes produced by :func:`encode`.

    Returns:
        The decoded, validated message.

    Raises:
        ProtocolError: on any malformed input, with what is wrong: not bytes, too short or too long, an unknown
            magic, an unsupported version, a length prefix that disagrees with the bytes present, a CRC mismatch,
            unknown flags, counts beyond their maxima or the buffer, or field values the message rejects.
    """
    frame = read_frame(data, _KINDS, max_bytes=MAX_MESSAGE_BYTES)
    if frame.kind is ABORT_KIND:
        return decode_abort_body(frame)
    if frame.kind is STATE_KIND:
        return decode_state_body(frame)
    return _decode_transition_body(frame)


@overload
def decode(data: Buffer) -> TransitionMessage: ...
@overload
def decode(data: Buffer, expect: type[_M]) -> _M: ...
def decode(data: Buffer, expect: type[object] = TransitionMessage) -> ControlMessage:
    """Decode a message of one expected kind (by default a :class:`TransitionMessage`).

    Args:
        data: the bytes produced by :func:`encode`.
        expect: the kind the caller waits for: ``TransitionMessage``, ``AbortMessage`` or
            ``OptimizerStateHeader``.

    Returns:
        The decoded, validated message.

    Raises:
        ProtocolError: everything :func:`decode_any` raises, and a well-formed message of another kind; for an
            abort the error says so and carries its rank and reason (use :func:`decode_any` to receive aborts
            as values).
    """
    # ``type[object]``: mypy does not match a union of classes against the constrained ``type[_M]`` overload.
    if expect not in _EXPECTABLE:
        raise ProtocolTypeError(f"decode can expect {', '.join(k.__name__ for k in _EXPECTABLE)}, got {expect!r}")
    msg = decode_any(data)
    if isinstance(msg, expect):
        return msg
    if isinstance(msg, AbortMessage):
        raise ProtocolError(
            f"message is an abort from rank {msg.rank}, not a {expect.__name__}: {msg.reason} "
            "(decode_any receives aborts as values)"
        )
    raise ProtocolError(f"message is a {type(msg).__name__}, expected a {expect.__name__}")
