"""The body of an :class:`~elastic_pipe.protocol.optimizer_state.OptimizerStateHeader` (kind ``b"EPOS"``).

Body layout (little-endian; variable length, read front to back)::

    n_params          u32  at most MAX_STATE_PARAMS
    per parameter:
      n_entries       u16  at most MAX_STATE_ENTRIES
      per entry:
        kind          u8   index into ENTRY_KINDS: 0 tensor, 1 int, 2 float, 3 bool, 4 none
        key_len       u8
        key           key_len bytes of UTF-8
        tensor:       dtype u8 (index into DTYPE_NAMES), device u8 (index into DEVICE_TYPES), ndim u8,
                      then ndim x u64 sizes
        int:          i64
        float:        f64
        bool:         u8, 0 or 1
        none:         nothing

Every count is checked against its maximum and against the bytes left before anything is read for it (each
parameter takes at least 2 bytes, each entry at least 2), vocabulary codes against their vocabularies, and the
body must end exactly after the last entry; the dataclasses then check the values (distinct keys, sizes in
range). The encoding is canonical: a header that decodes re-encodes to the same bytes.
"""

from __future__ import annotations

import struct

from elastic_pipe.protocol.errors import ProtocolError
from elastic_pipe.protocol.frame import Frame, Kind, Reader
from elastic_pipe.protocol.optimizer_state import (
    DEVICE_TYPES,
    DTYPE_NAMES,
    ENTRY_KINDS,
    ENTRY_PREFIX_BYTES,
    MAX_NDIM,
    MAX_STATE_BYTES,
    MAX_STATE_ENTRIES,
    MAX_STATE_PARAMS,
    PARAM_PREFIX_BYTES,
    OptimizerStateHeader,
    StateEntry,
)

__all__ = ["STATE_KIND", "decode_state_body", "encode_state_body"]

STATE_KIND = Kind("OptimizerStateHeader", b"EPOS", MAX_STATE_BYTES)
_N_PARAMS = struct.Struct("<I")
_N_ENTRIES = struct.Struct("<H")
_ENTRY = struct.Struct("<BB")
_TENSOR = struct.Struct("<BBB")
_SCALAR = {"int": struct.Struct("<q"), "float": struct.Struct("<d"), "bool": struct.Struct("<B")}


def _encode_entry(e: StateEntry) -> bytes:
    key = e.key.encode("utf-8")
    head = _ENTRY.pack(ENTRY_KINDS.index(e.kind), len(key)) + key
    if e.kind == "tensor":
        assert e.dtype is not None and e.device is not None and e.shape is not None  # the constructor checked
        shape = e.shape
        tensor = _TENSOR.pack(DTYPE_NAMES.index(e.dtype), DEVICE_TYPES.index(e.device), len(shape))
        return head + tensor + struct.pack(f"<{len(shape)}Q", *shape)
    if e.kind == "none":
        return head
    return head + _SCALAR[e.kind].pack(e.value)


def encode_state_body(msg: OptimizerStateHeader) -> bytes:
    """The body bytes of ``msg`` (the frame goes around them)."""
    parts = [_N_PARAMS.pack(len(msg.params))]
    for entries in msg.params:
        parts.append(_N_ENTRIES.pack(len(entries)))
        parts.extend(_encode_entry(e) for e in entries)
    return b"".join(parts)


def _vocabulary(names: tuple[str, ...], code: int, what: str) -> str:
    if code >= len(names):
        raise ProtocolError(f"unknown {what} code {code} (known: 0-{len(names) - 1}, {', '.join(names)})")
    return names[code]


def _decode_entry(body: Reader, where: str) -> StateEntry:
    kind_code, key_len = body.unpack(_ENTRY, f"{where} kind and key length")
    kind = ENTRY_KINDS[kind_code] if kind_code < len(ENTRY_KINDS) else None
    if kind is None:
        raise ProtocolError(f"{where}: unknown entry kind code {kind_code} (known: {', '.join(ENTRY_KINDS)})")
    raw_key = body.raw(key_len, f"{where} key")
    try:
        key = raw_key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{where}: key is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if kind == "tensor":
        dtype_code, device_code, ndim = body.unpack(_TENSOR, f"{where} dtype, device and ndim")
        dtype = _vocabulary(DTYPE_NAMES, dtype_code, f"{where} dtype")
        device = _vocabulary(DEVICE_TYPES, device_code, f"{where} device")
        if ndim > MAX_NDIM:
            raise ProtocolError(f"{where}: tensor has {ndim} dimensions, more than the maximum {MAX_NDIM}")
        shape = body.array("Q", ndim, f"{where} shape")
        return StateEntry(key, "tensor", dtype=dtype, shape=shape, device=device)
    if kind == "none":
        return StateEntry(key, "none")
    (value,) = body.unpack(_SCALAR[kind], f"{where} value")
    if kind == "bool":
        if value not in (0, 1):
            raise ProtocolError(f"{where}: a bool is stored as 0 or 1, got {value}")
        value = bool(value)
    return StateEntry(key, kind, value=value)


def decode_state_body(frame: Frame) -> OptimizerStateHeader:
    """Read an optimizer-state header from a checked frame.

    Raises:
        ProtocolError: a count beyond its maximum or the bytes left, an unknown kind, dtype or device code, a key
            that is not UTF-8, a bool byte other than 0 or 1, trailing bytes, or values the dataclasses reject.
    """
    body = frame.reader()
    (n_params,) = body.unpack(_N_PARAMS, "parameter count")
    if n_params > MAX_STATE_PARAMS:
        raise ProtocolError(f"parameter count {n_params} exceeds the maximum {MAX_STATE_PARAMS}")
    if n_params * PARAM_PREFIX_BYTES > body.remaining:
        raise ProtocolError(f"parameter count {n_params} needs more than the {body.remaining} body bytes left")
    params: list[tuple[StateEntry, ...]] = []
    for i in range(n_params):
        (n_entries,) = body.unpack(_N_ENTRIES, f"params[{i}] entry count")
        if n_entries > MAX_STATE_ENTRIES:
            raise ProtocolError(f"params[{i}] entry count {n_entries} exceeds the maximum {MAX_STATE_ENTRIES}")
        if n_entries * ENTRY_PREFIX_BYTES > body.remaining:
            raise ProtocolError(f"params[{i}] entry count {n_entries} needs more than the {body.remaining} bytes left")
        params.append(tuple(_decode_entry(body, f"params[{i}][{j}]") for j in range(n_entries)))
    body.finish()
    return OptimizerStateHeader(tuple(params))
