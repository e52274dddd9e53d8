"""The optimizer-state header: what a source rank's optimizer holds for the parameters it hands over.

When a stage moves, its new owner needs the optimizer state too (Adam's moments and step). The source rank first
broadcasts an :class:`OptimizerStateHeader` on the control group: for each parameter, in the order both sides
agree on, the state entries by key. Tensor entries give what the receiver needs to allocate a buffer (dtype,
shape) and where the tensor lives (``device``: Adam keeps ``step`` on the CPU beside CUDA moments); the tensors
themselves follow on the data group. Scalars travel in the header. No torch here: dtypes and devices are names
from fixed vocabularies (``str(torch.float32).removeprefix("torch.")`` is ``"float32"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import UnionType
from typing import Literal, get_args

from elastic_pipe.protocol.errors import ProtocolError, ProtocolTypeError
from elastic_pipe.protocol.frame import FRAME_BYTES

__all__ = [
    "DEVICE_TYPES",
    "DTYPE_NAMES",
    "ENTRY_KINDS",
    "MAX_KEY_BYTES",
    "MAX_NDIM",
    "MAX_STATE_BYTES",
    "MAX_STATE_ENTRIES",
    "MAX_STATE_PARAMS",
    "EntryKind",
    "OptimizerStateHeader",
    "StateEntry",
]

#: The kinds of state entry. The order is the wire code (index); append only.
EntryKind = Literal["tensor", "int", "float", "bool", "none"]
ENTRY_KINDS: tuple[EntryKind, ...] = get_args(EntryKind)
#: torch dtype names without the ``torch.`` prefix, as ``str(dtype)`` spells them. The order is the wire code
#: (one byte); append only, so older encodings keep their meaning.
DTYPE_NAMES: tuple[str, ...] = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "complex32",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
)
#: torch device types (``tensor.device.type``) a state tensor may live on. Wire code = index; append only.
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "mps", "xpu", "hpu", "mtia", "xla", "privateuseone")
#: Most parameters one header describes: a move hands over a few sub-layers, each a handful of tensors.
MAX_STATE_PARAMS = 1 << 16
#: Most entries per parameter (Adam with amsgrad has 4).
MAX_STATE_ENTRIES = 256
#: Longest key in UTF-8 bytes (a one-byte length on the wire).
MAX_KEY_BYTES = 255
#: Most dimensions of a state tensor (torch's own limit).
MAX_NDIM = 64
#: Largest encoded header, framing included (8 MiB: 65,536 two-dimensional parameters with Adam state take about
#: 5 MiB); the constructor refuses anything bigger. It stays below the largest transition message, the ceiling of
#: every read.
MAX_STATE_BYTES = 1 << 23
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
# The wire sizes below mirror state_codec's layout, so the constructor can refuse a header too big to encode.
#: Wire bytes of one entry before its key: kind (u8) and key length (u8).
ENTRY_PREFIX_BYTES = 2
#: Wire bytes after the key, by kind (tensors add 8 per dimension): dtype, device, ndim (u8 x 3); i64; f64; u8.
ENTRY_PAYLOAD_BYTES: dict[str, int] = {"tensor": 3, "int": 8, "float": 8, "bool": 1, "none": 0}
#: Wire bytes per parameter before its entries (u16 entry count), and of the header body before them (u32 count).
PARAM_PREFIX_BYTES = 2
BODY_PREFIX_BYTES = 4


def _fail(field: str, expected: str, value: object, error: type[ProtocolError] = ProtocolError) -> ProtocolError:
    return error(f"StateEntry.{field} must be {expected}, got {value!r}")


def _error_for(value: object, kind: type | UnionType) -> type[ProtocolError]:
    """:class:`ProtocolTypeError` when ``value`` is not even of the field's type, else :class:`ProtocolError`."""
    return ProtocolError if isinstance(value, kind) else ProtocolTypeError


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One entry of a parameter's optimizer state.

    Build one with :meth:`tensor` or :meth:`scalar`; the constructor checks that the fields fit ``kind``.

    Attributes:
        key: the state dict key (``"exp_avg"``), at most :data:`MAX_KEY_BYTES` UTF-8 bytes.
        kind: ``"tensor"``, ``"int"``, ``"float"``, ``"bool"`` or ``"none"``.
        dtype: tensors only: a name from :data:`DTYPE_NAMES`.
        shape: tensors only: at most :data:`MAX_NDIM` sizes, each >= 0, with at most 2**63 - 1 elements in all.
        device: tensors only: where the tensor lives on the sender, from :data:`DEVICE_TYPES`.
        value: scalars only: an ``int`` in the int64 range (not a ``bool``), a ``float`` (any float64, NaN and
            infinities included: it is data, not a count) or a ``bool``; ``None`` for the other kinds.

    Raises:
        ProtocolError: on a field that does not fit the description above.
    """

    key: str
    kind: EntryKind
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    device: str | None = None
    value: int | float | bool | None = None

    @classmethod
    def tensor(cls, key: str, dtype: str, shape: tuple[int, ...], device: str = "cpu") -> StateEntry:
        """A tensor entry (``StateEntry.tensor("exp_avg", "float32", (768, 768), "cuda")``)."""
        return cls(key, "tensor", dtype=dtype, shape=shape, device=device)

    @classmethod
    def scalar(cls, key: str, value: int | float | bool | None) -> StateEntry:
        """A scalar entry whose kind follows the value's type (``bool`` before ``int``; ``None`` is ``"none"``).

        Raises:
            ProtocolError: ``value`` is none of ``bool``, ``int``, ``float``, ``None``.
        """
        kind: EntryKind
        if value is None:
            kind = "none"
        elif isinstance(value, bool):
            kind = "bool"
        elif isinstance(value, int):
            kind = "int"
        elif isinstance(value, float):
            kind = "float"
        else:
            raise ProtocolError(
                f"optimizer state {key!r} holds a {type(value).__name__}; only tensors, int, float, bool and None "
                "travel"
            )
        return cls(key, kind, value=value)

    def __post_init__(self) -> None:
        if not isinstance(self.key, str):
            raise _fail("key", "a str", self.key, ProtocolTypeError)
        try:
            key_bytes = len(self.key.encode("utf-8"))
        except UnicodeEncodeError:
            raise _fail("key", "encodable as UTF-8", self.key) from None
        if key_bytes > MAX_KEY_BYTES:
            raise _fail("key", f"at most {MAX_KEY_BYTES} UTF-8 bytes", self.key)
        if self.kind not in ENTRY_KINDS:
            error = ProtocolError if isinstance(self.kind, str) else ProtocolTypeError
            raise _fail("kind", f"one of {', '.join(ENTRY_KINDS)}", self.kind, error)
        if self.kind == "tensor":
            self._check_tensor()
            if self.value is not None:
                raise _fail("value", "None for a tensor entry", self.value)
            return
        for field, kind in (("dtype", str), ("shape", tuple), ("device", str)):
            given = getattr(self, field)
            if given is not None:
                raise _fail(field, f"None for a {self.kind} entry", given, _error_for(given, kind))
        v = self.value
        if self.kind == "none" and v is not None:
            raise _fail("value", "None for a none entry", v)
        if self.kind == "bool" and not isinstance(v, bool):
            raise _fail("value", "a bool for a bool entry", v, _error_for(v, bool | int | float | None))
        if self.kind == "int" and (not isinstance(v, int) or isinstance(v, bool) or not _I64_MIN <= v <= _I64_MAX):
            error = _error_for(v, bool | int | float | None)
            raise _fail("value", f"an int in [{_I64_MIN}, {_I64_MAX}] for an int entry", v, error)
        if self.kind == "float" and not isinstance(v, float):
            raise _fail("value", "a float for a float entry", v, _error_for(v, bool | int | float | None))

    def _check_tensor(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise _fail("dtype", f"one of {', '.join(DTYPE_NAMES)}", self.dtype)
        if self.device not in DEVICE_TYPES:
            raise _fail("device", f"one of {', '.join(DEVICE_TYPES)}", self.device)
        shape = self.shape
        if not isinstance(shape, tuple) or len(shape) > MAX_NDIM:
            raise _fail("shape", f"a tuple of at most {MAX_NDIM} sizes", shape)
        if any(not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= _I64_MAX for d in shape):
            raise _fail("shape", f"sizes that are ints in [0, {_I64_MAX}]", shape)
        if math.prod(shape) > _I64_MAX:
            raise _fail("shape", f"at most {_I64_MAX} elements", shape)

    @property
    def wire_bytes(self) -> int:
        """Bytes this entry takes in the encoded header."""
        extra = 8 * len(self.shape) if self.shape is not None else 0
        return ENTRY_PREFIX_BYTES + len(self.key.encode("utf-8")) + ENTRY_PAYLOAD_BYTES[self.kind] + extra


@dataclass(frozen=True, slots=True)
class OptimizerStateHeader:
    """The optimizer state a source rank holds for a list of parameters, without the tensor data.

    Attributes:
        params: one tuple of :class:`StateEntry` per parameter, in the order sender and receiver agree on; an
            empty tuple for a parameter without state. At most :data:`MAX_STATE_PARAMS` parameters, each with at
            most :data:`MAX_STATE_ENTRIES` entries under distinct keys; the whole encoding at most
            :data:`MAX_STATE_BYTES`.

    Raises:
        ProtocolError: on a field that does not fit the description above.
    """

    params: tuple[tuple[StateEntry, ...], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.params, tuple) or len(self.params) > MAX_STATE_PARAMS:
            raise (ProtocolError if isinstance(self.params, tuple) else ProtocolTypeError)(
                f"OptimizerStateHeader.params must be a tuple of at most {MAX_STATE_PARAMS} parameters, "
                f"got {type(self.params).__name__}"
                + (f" of length {len(self.params)}" if isinstance(self.params, tuple) else "")
            )
        size = FRAME_BYTES + BODY_PREFIX_BYTES
        for i, entries in enumerate(self.params):
            if not isinstance(entries, tuple) or len(entries) > MAX_STATE_ENTRIES:
                raise (ProtocolError if isinstance(entries, tuple) else ProtocolTypeError)(
                    f"OptimizerStateHeader.params[{i}] must be a tuple of at most {MAX_STATE_ENTRIES} StateEntry, "
                    f"got {type(entries).__name__}"
                )
            keys = set()
            for entry in entries:
                if not isinstance(entry, StateEntry):
                    raise ProtocolTypeError(
                        f"OptimizerStateHeader.params[{i}] must hold StateEntry values, got {type(entry).__name__}"
                    )
                if entry.key in keys:
                    raise ProtocolError(f"OptimizerStateHeader.params[{i}] repeats the key {entry.key!r}")
                keys.add(entry.key)
                size += entry.wire_bytes
            size += PARAM_PREFIX_BYTES
        if size > MAX_STATE_BYTES:
            raise ProtocolError(
                f"OptimizerStateHeader would take {size} bytes encoded, more than the maximum {MAX_STATE_BYTES}"
            )

    def tensors(self) -> tuple[tuple[int, StateEntry], ...]:
        """The tensor entries as ``(parameter index, entry)``, in order: the order their data travels in."""
        return tuple((i, e) for i, entries in enumerate(self.params) for e in entries if e.kind == "tensor")
