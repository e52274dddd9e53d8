"""The abort message: a rank's one-line error, sent on the control group instead of the message it owed.

When rank 0 cannot decide a transition (or a source rank cannot describe its optimizer state), every other rank
is already waiting in the broadcast. Sending an :class:`AbortMessage` in place of the expected message lets every
rank stop at once with the same reason, instead of waiting until the collective times out.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from elastic_pipe.protocol.errors import ProtocolError, ProtocolTypeError

__all__ = ["MAX_REASON_BYTES", "AbortMessage"]

#: Longest reason in UTF-8 bytes: room for an error that names its offending values, still one log line.
MAX_REASON_BYTES = 4096
_U32_MAX = (1 << 32) - 1
#: Unicode categories that would break the line or hide text in a log: controls (\n, \r, \t, ESC, ...) and the
#: line and paragraph separators.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})
_REPLACED_CATEGORIES = _FORBIDDEN_CATEGORIES | {"Cs"}
_ELLIPSIS = "..."


def _bad_character(text: str) -> str | None:
    for ch in text:
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            return ch
    return None


@dataclass(frozen=True, slots=True)
class AbortMessage:
    """A rank's error, sent instead of the message the other ranks are waiting for.

    Attributes:
        rank: the rank that failed (a u32 on the wire).
        reason: one printable line of UTF-8, 1 to :data:`MAX_REASON_BYTES` bytes, not blank: no control
            characters (newline, carriage return, tab, escape, ...) and no line or paragraph separators.

    Raises:
        ProtocolError: on a field that does not fit the description above.
    """

    rank: int
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool):
            raise ProtocolTypeError(f"AbortMessage.rank must be an int in [0, {_U32_MAX}], got {self.rank!r}")
        if not 0 <= self.rank <= _U32_MAX:
            raise ProtocolError(f"AbortMessage.rank must be an int in [0, {_U32_MAX}], got {self.rank!r}")
        if not isinstance(self.reason, str):
            raise ProtocolTypeError(f"AbortMessage.reason must be a str, got {type(self.reason).__name__}")
        if not self.reason.strip():
            raise ProtocolError("AbortMessage.reason must not be empty or blank")
        try:
            size = len(self.reason.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ProtocolError(f"AbortMessage.reason is not encodable as UTF-8: {exc.reason}") from None
        if size > MAX_REASON_BYTES:
            raise ProtocolError(f"AbortMessage.reason has {size} UTF-8 bytes, more than the maximum {MAX_REASON_BYTES}")
        bad = _bad_character(self.reason)
        if bad is not None:
            raise ProtocolError(
                f"AbortMessage.reason must be a single printable line, found {bad!r} "
                f"(U+{ord(bad):04X}, category {unicodedata.category(bad)})"
            )

    @classmethod
    def from_text(cls, rank: int, text: str) -> AbortMessage:
        """An abort whose reason is ``text`` made into one valid line.

        Runs of whitespace (newlines included) become one space, other control characters and separators become
        U+FFFD, lone surrogates too, and a reason longer than :data:`MAX_REASON_BYTES` is cut
        at a character boundary and ends in ``"..."``. Empty text becomes ``"(no reason given)"``.

        Args:
            rank: the failing rank.
            text: any text, typically ``str(exc)``.

        Raises:
            ProtocolError: ``rank`` is out of range.
        """
        line = " ".join(str(text).split())
        # Lone surrogates (category Cs) cannot be encoded as UTF-8; they are replaced like the controls.
        line = "".join("\ufffd" if unicodedata.category(ch) in _REPLACED_CATEGORIES else ch for ch in line)
        encoded = line.encode("utf-8")
        if len(encoded) > MAX_REASON_BYTES:
            cut = encoded[: MAX_REASON_BYTES - len(_ELLIPSIS)].decode("utf-8", errors="ignore")
            line = cut + _ELLIPSIS
        return cls(rank, line or "(no reason given)")
