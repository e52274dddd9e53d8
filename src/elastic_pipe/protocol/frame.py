"""The framing every control message shares: a kind tag, a version, a length prefix and a CRC32.

Layout (little-endian; offsets in bytes)::

    0        magic        4s   the kind tag: b"EPTM" transition, b"EPAB" abort, b"EPOS" optimizer-state header
    4        version      u16  the kind's body layout: 1 for aborts and optimizer-state headers, 2 for transitions
                               (version 1 transitions, without the virtual-stage count, still decode)
    6        flags        u16  kind-specific; unknown bits are refused
    8        body_length  u32  bytes between this header and the checksum
    12       body         body_length bytes, laid out by the kind's codec
    end - 4  crc32        u32  zlib.crc32 of header and body

Why one frame for every kind: a receiver of the control-group broadcast must tell an abort from a transition
before it trusts a single field, and every check that guards a transition message (size ceiling, length prefix
against the bytes present, checksum, flags) guards the other kinds the same way. The magic sits inside the CRC, so
a corrupted byte cannot turn one kind into another. Bodies are read through :class:`Reader`, which checks every
count against the bytes left before it reads, so a hostile buffer costs at most its own size.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_pipe.protocol.errors import ProtocolError, ProtocolTypeError

__all__ = ["FRAME_BYTES", "HEADER", "VERSION", "Buffer", "Frame", "Kind", "Reader", "read_frame", "write_frame"]

#: The first version of every kind; a kind that changes its body layout bumps its own version and keeps reading
#: the old ones (:attr:`Kind.versions`).
VERSION = 1
HEADER = struct.Struct("<4sHHI")
_CRC = struct.Struct("<I")
#: Bytes of framing around a body (header and checksum).
FRAME_BYTES = HEADER.size + _CRC.size

#: What the decoders accept as input.
Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Kind:
    """One message kind as the framing sees it.

    Attributes:
        name: the message class, for errors (``"TransitionMessage"``).
        magic: the 4-byte kind tag.
        max_bytes: the largest valid encoding of this kind, framing included.
        known_flags: the flag bits this kind defines.
        versions: the body layouts a decoder reads, oldest first; an encoder writes the last.
    """

    name: str
    magic: bytes
    max_bytes: int
    known_flags: int = 0
    versions: tuple[int, ...] = (VERSION,)


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame whose size, length prefix, checksum, version and flags have been checked; the body is not read yet."""

    kind: Kind
    flags: int
    buf: bytes
    version: int = VERSION

    def reader(self) -> Reader:
        """A fresh bounded reader over the body."""
        return Reader(self.buf, HEADER.size, len(self.buf) - _CRC.size, self.kind.name)


def write_frame(kind: Kind, flags: int, body: bytes) -> bytes:
    """Frame ``body`` as a ``kind`` message (header, body, CRC32) at the kind's newest version.

    Raises:
        ProtocolError: the framed message would exceed ``kind.max_bytes`` (the decoder would refuse it).
    """
    if FRAME_BYTES + len(body) > kind.max_bytes:
        raise ProtocolError(
            f"{kind.name} would take {FRAME_BYTES + len(body)} bytes, more than its maximum {kind.max_bytes}"
        )
    head_body = HEADER.pack(kind.magic, kind.versions[-1], flags, len(body)) + body
    return head_body + _CRC.pack(zlib.crc32(head_body))


def _expected(kinds: Mapping[bytes, Kind]) -> str:
    return ", ".join(f"{magic!r} ({k.name})" for magic, k in kinds.items())


def read_frame(data: object, kinds: Mapping[bytes, Kind], *, max_bytes: int) -> Frame:
    """Check the framing of ``data`` and identify its kind.

    Checks, in order: the input is bytes; its size is at most ``max_bytes`` (before anything is copied) and at
    least the framing; the magic names one of ``kinds``; the size is within that kind's maximum; the version; the
    length prefix equals the bytes present; the CRC; no unknown flag bits.

    Args:
        data: the encoded message (``bytes``, ``bytearray`` or ``memoryview``).
        kinds: the kinds this caller can read, by magic.
        max_bytes: the ceiling checked before the kind is known (the largest of the caller's kinds).

    Returns:
        The checked frame.

    Raises:
        ProtocolError: on any of the checks above, saying which.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolTypeError(f"decode: data must be bytes, got {type(data).__name__}")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size > max_bytes:
        raise ProtocolError(f"message has {size} bytes, more than the largest valid message ({max_bytes} bytes)")
    buf = data.tobytes() if isinstance(data, memoryview) else bytes(data)
    if len(buf) < FRAME_BYTES:
        raise ProtocolError(f"message truncated: {len(buf)} bytes, a message has at least {FRAME_BYTES}")
    magic, version, flags, body_length = HEADER.unpack_from(buf, 0)
    kind = kinds.get(magic)
    if kind is None:
        raise ProtocolError(f"wrong magic {magic!r}, expected {_expected(kinds)} (not an elastic_pipe control message)")
    if len(buf) > kind.max_bytes:
        raise ProtocolError(
            f"{kind.name} has {len(buf)} bytes, more than the largest valid one ({kind.max_bytes} bytes)"
        )
    if version not in kind.versions:
        readable = ", ".join(str(v) for v in kind.versions)
        raise ProtocolError(
            f"unsupported message version {version} ({kind.name}), this decoder reads version {readable}"
        )
    present = len(buf) - FRAME_BYTES
    if body_length != present:
        raise ProtocolError(
            f"length prefix says the body has {body_length} bytes but {present} are present "
            "(truncated message or trailing bytes)"
        )
    (expected_crc,) = _CRC.unpack_from(buf, len(buf) - _CRC.size)
    actual_crc = zlib.crc32(buf[: len(buf) - _CRC.size])
    if actual_crc != expected_crc:
        raise ProtocolError(f"CRC32 mismatch: message says {expected_crc:#010x}, content gives {actual_crc:#010x}")
    if flags & ~kind.known_flags:
        raise ProtocolError(
            f"unknown flag bits {flags & ~kind.known_flags:#06x} for a {kind.name} (known: {kind.known_flags:#06x})"
        )
    return Frame(kind, flags, buf, version)


class Reader:
    """A cursor over a body that refuses to read past its end (internal to the codecs)."""

    __slots__ = ("_buf", "_end", "_offset", "_what")

    def __init__(self, buf: bytes, offset: int, end: int, what: str) -> None:
        self._buf = buf
        self._offset = offset
        self._end = end
        self._what = what

    @property
    def offset(self) -> int:
        """Where the next read starts (an offset into the whole frame)."""
        return self._offset

    @property
    def remaining(self) -> int:
        """Body bytes not read yet."""
        return self._end - self._offset

    def _need(self, n: int, field: str) -> None:
        if n > self.remaining:
            raise ProtocolError(
                f"{self._what} truncated at offset {self._offset}: {field} needs {n} bytes, {self.remaining} are left"
            )

    def unpack(self, fmt: struct.Struct, field: str) -> tuple[Any, ...]:
        """Read one fixed-size record."""
        self._need(fmt.size, field)
        values = fmt.unpack_from(self._buf, self._offset)
        self._offset += fmt.size
        return values

    def array(self, code: str, count: int, field: str) -> tuple[Any, ...]:
        """Read ``count`` values of struct type ``code`` (the count is checked against the bytes left first)."""
        item = struct.calcsize(code)
        self._need(count * item, field)
        values = struct.unpack_from(f"<{count}{code}", self._buf, self._offset)
        self._offset += count * item
        return values

    def raw(self, n: int, field: str) -> bytes:
        """Read ``n`` bytes."""
        self._need(n, field)
        out = self._buf[self._offset : self._offset + n]
        self._offset += n
        return out

    def finish(self) -> None:
        """Refuse bytes left over after the last field."""
        if self.remaining:
            raise ProtocolError(f"{self._what} has {self.remaining} bytes after its last field (offset {self._offset})")
