"""The published PipeTransformer control message: a list of 50 floats (REFERENCE.md section 4).

Layout, index by index::

    [0]           number of frozen layers
    [1]           new pipeline length
    [2]           largest per-device parameter size at the start (M0, millions of parameters)
    [3]           epoch of the transition
    [4]           n = number of newly activated ranks
    [5 : 5+n]     those ranks
    [5+n : 5+n+L] the last per-layer gradient norms, or the single value -1 at [5+n] when there are none
    the rest      0.0 padding

The layout does not carry L, the number of gradient norms. :func:`decode_legacy` therefore reads the norms as the
values from ``[5+n]`` up to the last non-zero value: zeros inside the list are kept, trailing zeros are padding.
A trailing norm of exactly 0.0 is lost that way; a caller that knows L passes ``num_layers`` and gets exactly L
values back. Anything that does not fit the layout (wrong length, NaN or infinity anywhere, a count that is not
a non-negative whole number, ranks that repeat, a negative norm, non-zero padding after the -1 marker) raises
:class:`~elastic_pipe.protocol.errors.ProtocolError`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from elastic_pipe.protocol.errors import CHECK, ProtocolError, ProtocolTypeError

__all__ = ["LEGACY_LENGTH", "LegacyMessage", "decode_legacy", "encode_legacy"]

#: Number of floats in the published message.
LEGACY_LENGTH = 50
#: Index of the first newly activated rank; [0:5] are the fixed fields.
_FIRST_RANK = 5
#: Written at [5+n] when there are no gradient norms.
_NO_NORMS = -1.0
#: Whole numbers above this are not exactly representable as float64.
_MAX_EXACT_INT = 1 << 53


def _whole(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _MAX_EXACT_INT:
        error = ProtocolError if isinstance(value, int) and not isinstance(value, bool) else ProtocolTypeError
        raise error(f"LegacyMessage.{name} must be an int in [{low}, 2**53], got {value!r}")


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    """The published 50-float message, with names.

    Attributes:
        num_frozen_layers: number of frozen layers.
        pipe_len: new pipeline length.
        max_params_per_gpu: largest per-device parameter size at the start (M0), in millions of parameters.
        epoch: epoch of the transition.
        new_ranks: ranks activated by this transition, distinct.
        grad_norms: the last per-layer gradient norms (finite, >= 0), or None when there are none.

    Raises:
        ProtocolError: a field does not fit, or the message would not fit in 50 floats.
    """

    num_frozen_layers: int
    pipe_len: int
    max_params_per_gpu: float
    epoch: int
    new_ranks: tuple[int, ...] = ()
    grad_norms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _whole("num_frozen_layers", self.num_frozen_layers, 0)
        _whole("pipe_len", self.pipe_len, 1)
        _whole("epoch", self.epoch, 0)
        m0 = self.max_params_per_gpu
        CHECK.number("LegacyMessage.max_params_per_gpu", m0)
        if not math.isfinite(m0) or m0 < 0:
            raise ProtocolError(f"LegacyMessage.max_params_per_gpu must be finite and >= 0, got {m0!r}")
        if not isinstance(self.new_ranks, tuple):
            raise ProtocolTypeError(f"LegacyMessage.new_ranks must be a tuple, got {type(self.new_ranks).__name__}")
        for r in self.new_ranks:
            _whole("new_ranks[...]", r, 0)
        if len(set(self.new_ranks)) != len(self.new_ranks):
            raise ProtocolError(f"LegacyMessage.new_ranks must be distinct, got {self.new_ranks!r}")
        if self.grad_norms is not None:
            if not isinstance(self.grad_norms, tuple):
                raise ProtocolTypeError(
                    f"LegacyMessage.grad_norms must be None or a tuple, got {type(self.grad_norms).__name__}"
                )
            for g in self.grad_norms:
                if not isinstance(g, float | int) or isinstance(g, bool) or not math.isfinite(g) or g < 0:
                    raise ProtocolError(f"LegacyMessage.grad_norms must hold finite values >= 0, got {g!r}")
        tail = 1 if self.grad_norms is None else len(self.grad_norms)
        used = _FIRST_RANK + len(self.new_ranks) + tail
        if used > LEGACY_LENGTH:
            raise ProtocolError(
                f"message needs {used} floats ({len(self.new_ranks)} new ranks, "
                f"{'the -1 marker' if self.grad_norms is None else f'{tail} gradient norms'}) "
                f"but the published layout has {LEGACY_LENGTH}"
            )


def encode_legacy(msg: LegacyMessage) -> list[float]:
    """Write the published 50-float list.

    Args:
        msg: the message.

    Returns:
        Exactly :data:`LEGACY_LENGTH` floats.

    Raises:
        ProtocolError: ``msg`` is not a :class:`LegacyMessage`.
    """
    if not isinstance(msg, LegacyMessage):
        raise ProtocolTypeError(f"encode_legacy: msg must be a LegacyMessage, got {type(msg).__name__}")
    out = [0.0] * LEGACY_LENGTH
    out[0] = float(msg.num_frozen_layers)
    out[1] = float(msg.pipe_len)
    out[2] = float(msg.max_params_per_gpu)
    out[3] = float(msg.epoch)
    out[4] = float(len(msg.new_ranks))
    tail = _FIRST_RANK + len(msg.new_ranks)
    out[_FIRST_RANK:tail] = [float(r) for r in msg.new_ranks]
    if msg.grad_norms is None:
        out[tail] = _NO_NORMS
    else:
        out[tail : tail + len(msg.grad_norms)] = [float(g) for g in msg.grad_norms]
    return out


def _as_floats(values: Sequence[float]) -> list[float]:
    if isinstance(values, str | bytes | bytearray):
        raise ProtocolTypeError(f"decode_legacy: values must be a sequence of numbers, got {type(values).__name__}")
    try:
        n = len(values)
    except TypeError:
        raise ProtocolTypeError(
            f"decode_legacy: values must be a sequence of numbers, got {type(values).__name__}"
        ) from None
    if n != LEGACY_LENGTH:
        raise ProtocolError(f"the published message (values) has exactly {LEGACY_LENGTH} floats, got {n}")
    floats: list[float] = []
    items: Sequence[object] = values  # callers may hand over anything; check each item
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ProtocolError(f"value [{i}] is not a number: {v!r}")
        f = float(v)
        if not math.isfinite(f):
            raise ProtocolError(f"value [{i}] is {f}, the published message holds only finite numbers")
        floats.append(f)
    return floats


def _count(floats: list[float], index: int, what: str, low: int, high: int) -> int:
    v = floats[index]
    if v != math.floor(v) or not low <= v <= high:
        raise ProtocolError(f"value [{index}] ({what}) must be a whole number in [{low}, {high}], got {v!r}")
    return int(v)


def decode_legacy(values: Sequence[float], *, num_layers: int | None = None) -> LegacyMessage:
    """Read the published 50-float list.

    Args:
        values: the 50 floats (any real numbers: Python floats, ints, numpy scalars).
        num_layers: L, the number of gradient norms, when the caller knows it. Without it the norms are the
            values from ``[5+n]`` through the last non-zero one (see the module docstring).

    Returns:
        The decoded message.

    Raises:
        ProtocolError: anything that does not fit the layout; the message names the index and what belongs there.
    """
    CHECK.optional_int("decode_legacy: num_layers", num_layers, hi=LEGACY_LENGTH)
    floats = _as_floats(values)
    max_ranks = LEGACY_LENGTH - _FIRST_RANK
    frozen = _count(floats, 0, "number of frozen layers", 0, _MAX_EXACT_INT)
    pipe_len = _count(floats, 1, "new pipeline length", 1, _MAX_EXACT_INT)
    m0 = floats[2]
    if m0 < 0:
        raise ProtocolError(f"value [2] (largest per-device parameter size) must be >= 0, got {m0!r}")
    epoch = _count(floats, 3, "epoch", 0, _MAX_EXACT_INT)
    n = _count(floats, 4, "number of new ranks", 0, max_ranks)
    ranks = tuple(
        _count(floats, i, "a newly activated rank", 0, _MAX_EXACT_INT) for i in range(_FIRST_RANK, _FIRST_RANK + n)
    )
    if len(set(ranks)) != n:
        raise ProtocolError(f"values [5:{5 + n}] (new ranks) repeat a rank: {list(ranks)}")
    start = _FIRST_RANK + n
    tail = floats[start:]
    norms: tuple[float, ...] | None
    if tail and tail[0] == _NO_NORMS:
        end = start + 1
        norms = None
    elif num_layers is not None:
        if not 0 <= num_layers <= len(tail):
            raise ProtocolError(
                f"num_layers={num_layers} gradient norms do not fit after {n} new ranks "
                f"(room for {len(tail)} in {LEGACY_LENGTH} floats)"
            )
        end = start + num_layers
        norms = tuple(tail[:num_layers])
    else:
        nonzero = [i for i, v in enumerate(tail) if v != 0.0]
        end = start + (nonzero[-1] + 1 if nonzero else 0)
        norms = tuple(floats[start:end])
    for i, g in enumerate(norms or (), start=start):
        if g < 0:
            raise ProtocolError(f"value [{i}] (a gradient norm) must be >= 0, got {g!r}")
    padding = [i for i in range(end, LEGACY_LENGTH) if floats[i] != 0.0]
    if padding:
        raise ProtocolError(f"value [{padding[0]}] must be 0.0 padding, got {floats[padding[0]]!r}")
    return LegacyMessage(
        num_frozen_layers=frozen,
        pipe_len=pipe_len,
        max_params_per_gpu=m0,
        epoch=epoch,
        new_ranks=ranks,
        grad_norms=norms,
    )
