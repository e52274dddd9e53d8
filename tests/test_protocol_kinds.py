"""elastic_pipe.protocol: the abort and optimizer-state kinds, decode_any, and decode of an unexpected kind."""

from __future__ import annotations

import math
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.protocol import (
    DEVICE_TYPES,
    DTYPE_NAMES,
    ENTRY_KINDS,
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_NDIM,
    MAX_REASON_BYTES,
    MAX_STATE_BYTES,
    MAX_STATE_ENTRIES,
    MAX_STATE_PARAMS,
    AbortMessage,
    OptimizerStateHeader,
    ProtocolError,
    StateEntry,
    TransitionMessage,
    decode,
    decode_any,
    encode,
)

SETTINGS = settings(max_examples=60, deadline=None)

TRANSITION = TransitionMessage(3, 1200, 4, 2, (4, 8, 12), 16, 21.5, (1, 9), (0.5, 0.25))
ABORT = AbortMessage(3, "no feasible partition: 5 stages for 4 layers")
ADAM = OptimizerStateHeader(
    (
        (
            StateEntry.tensor("step", "float32", (), "cpu"),
            StateEntry.tensor("exp_avg", "bfloat16", (4, 2), "cuda"),
        ),
        (),
        (StateEntry.scalar("n", 7), StateEntry.scalar("lr", 0.5), StateEntry.scalar("on", True)),
        (StateEntry.scalar("absent", None),),
    )
)


def _frame(magic: bytes, body: bytes, *, flags: int = 0, version: int = 1) -> bytes:
    """A message framed by hand from the documented layout (not by ``encode``), with a correct CRC."""
    head_body = struct.pack("<4sHHI", magic, version, flags, len(body)) + body
    return head_body + struct.pack("<I", zlib.crc32(head_body))


def _abort_body(rank: int, reason: bytes, n: int | None = None) -> bytes:
    return struct.pack("<IH", rank, len(reason) if n is None else n) + reason


def _state_entry(kind: int, key: bytes, payload: bytes = b"") -> bytes:
    return struct.pack("<BB", kind, len(key)) + key + payload


def _state_body(*params: list[bytes], n_params: int | None = None) -> bytes:
    out = struct.pack("<I", len(params) if n_params is None else n_params)
    for entries in params:
        out += struct.pack("<H", len(entries)) + b"".join(entries)
    return out


def _tensor(dtype: int, device: int, shape: tuple[int, ...], ndim: int | None = None) -> bytes:
    n = len(shape) if ndim is None else ndim
    return struct.pack(f"<BBB{len(shape)}Q", dtype, device, n, *shape)


# --- exact layouts ----------------------------------------------------------------------------------------------


def test_abort_follows_the_documented_layout() -> None:
    data = encode(ABORT)
    reason = ABORT.reason.encode()
    assert data == _frame(b"EPAB", struct.pack("<IH", 3, len(reason)) + reason)
    assert len(data) == 12 + 6 + len(reason) + 4


def test_optimizer_state_header_follows_the_documented_layout() -> None:
    body = _state_body(
        [_state_entry(0, b"step", _tensor(0, 0, ())), _state_entry(0, b"exp_avg", _tensor(3, 1, (4, 2)))],
        [],
        [
            _state_entry(1, b"n", struct.pack("<q", 7)),
            _state_entry(2, b"lr", struct.pack("<d", 0.5)),
            _state_entry(3, b"on", b"\x01"),
        ],
        [_state_entry(4, b"absent")],
    )
    assert encode(ADAM) == _frame(b"EPOS", body)
    assert decode_any(_frame(b"EPOS", body)) == ADAM


def test_entry_wire_bytes_predict_the_encoded_size() -> None:
    size = 16 + 4 + sum(2 + sum(e.wire_bytes for e in entries) for entries in ADAM.params)
    assert len(encode(ADAM)) == size


def test_every_kind_fits_under_the_one_read_ceiling() -> None:
    assert 12 + 6 + MAX_REASON_BYTES + 4 < MAX_STATE_BYTES < MAX_MESSAGE_BYTES


# --- decode_any and decode --------------------------------------------------------------------------------------


def test_decode_any_tells_the_kinds_apart() -> None:
    assert decode_any(encode(TRANSITION)) == TRANSITION
    assert decode_any(encode(ABORT)) == ABORT
    assert decode_any(encode(ADAM)) == ADAM
    assert decode_any(memoryview(encode(ABORT))) == ABORT


def test_decode_keeps_reading_transitions_and_reads_other_kinds_on_request() -> None:
    assert decode(encode(TRANSITION)) == TRANSITION
    assert decode(encode(ABORT), AbortMessage) == ABORT
    assert decode(bytearray(encode(ADAM)), OptimizerStateHeader) == ADAM


def test_decode_of_an_abort_says_it_is_an_abort() -> None:
    with pytest.raises(ProtocolError, match="message is an abort from rank 3, not a TransitionMessage: no feasible"):
        decode(encode(ABORT))
    with pytest.raises(ProtocolError, match="abort from rank 3, not a OptimizerStateHeader"):
        decode(encode(ABORT), OptimizerStateHeader)


def test_decode_of_another_kind_names_both() -> None:
    with pytest.raises(ProtocolError, match="message is a OptimizerStateHeader, expected a TransitionMessage"):
        decode(encode(ADAM))
    with pytest.raises(ProtocolError, match="message is a TransitionMessage, expected a AbortMessage"):
        decode(encode(TRANSITION), AbortMessage)
    with pytest.raises(ProtocolError, match="decode can expect TransitionMessage, AbortMessage, Optimizer"):
        decode(encode(TRANSITION), dict)  # type: ignore[type-var]


def test_encode_rejects_other_objects() -> None:
    with pytest.raises(ProtocolError, match="TransitionMessage, AbortMessage or OptimizerStateHeader, got dict"):
        encode({"rank": 0})  # type: ignore[arg-type]


# --- properties -------------------------------------------------------------------------------------------------

_printable = st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"))
reasons = st.text(_printable, min_size=1, max_size=80).filter(lambda s: bool(s.strip()))
aborts = st.builds(AbortMessage, st.integers(0, 2**32 - 1), reasons)
keys = st.text(st.characters(codec="utf-8"), max_size=12)


def _entries(floats: st.SearchStrategy[float]) -> st.SearchStrategy[StateEntry]:
    tensor = st.builds(
        StateEntry.tensor,
        keys,
        st.sampled_from(DTYPE_NAMES),
        st.lists(st.integers(0, 4096), max_size=4).map(tuple),
        st.sampled_from(DEVICE_TYPES),
    )
    values = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | floats
    return tensor | st.builds(StateEntry.scalar, keys, values)


def _headers(floats: st.SearchStrategy[float]) -> st.SearchStrategy[OptimizerStateHeader]:
    param = st.lists(_entries(floats), max_size=5, unique_by=lambda e: e.key).map(tuple)
    return st.lists(param, max_size=6).map(lambda ps: OptimizerStateHeader(tuple(ps)))


headers = _headers(st.floats(allow_nan=False))
any_messages = aborts | headers


@SETTINGS
@given(any_messages)
def test_every_valid_message_round_trips_exactly(msg: AbortMessage | OptimizerStateHeader) -> None:
    data = encode(msg)
    assert decode_any(data) == msg
    assert decode(data, type(msg)) == msg
    assert encode(decode_any(data)) == data


@SETTINGS
@given(_headers(st.floats()))
def test_nan_and_infinite_scalars_round_trip_bit_for_bit(msg: OptimizerStateHeader) -> None:
    data = encode(msg)
    assert encode(decode_any(data)) == data


@SETTINGS
@given(any_messages, st.data())
def test_any_single_byte_change_is_a_protocol_error(
    msg: AbortMessage | OptimizerStateHeader, data: st.DataObject
) -> None:
    raw = bytearray(encode(msg))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(ProtocolError):
        decode_any(bytes(raw))


@SETTINGS
@given(any_messages, st.data())
def test_truncation_and_trailing_bytes_are_protocol_errors(
    msg: AbortMessage | OptimizerStateHeader, data: st.DataObject
) -> None:
    raw = encode(msg)
    with pytest.raises(ProtocolError):
        decode_any(raw[: data.draw(st.integers(0, len(raw) - 1))])
    with pytest.raises(ProtocolError):
        decode_any(raw + data.draw(st.binary(min_size=1, max_size=8)))


@SETTINGS
@given(any_messages, st.data())
def test_mutations_behind_a_valid_crc_decode_canonically_or_raise(
    msg: AbortMessage | OptimizerStateHeader, data: st.DataObject
) -> None:
    raw = bytearray(encode(msg)[:-4])
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    forged = bytes(raw) + struct.pack("<I", zlib.crc32(bytes(raw)))
    try:
        decoded = decode_any(forged)
    except ProtocolError:
        return
    assert encode(decoded) == forged


@SETTINGS
@given(st.sampled_from([b"EPTM", b"EPAB", b"EPOS"]), st.binary(max_size=300))
def test_random_bodies_behind_a_valid_frame_raise_only_protocol_error(magic: bytes, body: bytes) -> None:
    try:
        decoded = decode_any(_frame(magic, body))
    except ProtocolError:
        return
    assert encode(decoded) == _frame(magic, body)


# --- hostile input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (_frame(b"EPXX", b""), r"wrong magic b'EPXX', expected b'EPTM' \(TransitionMessage\), b'EPAB'"),
        (encode(ABORT)[:3], "message truncated: 3 bytes"),
        (encode(ABORT)[:-3], "length prefix"),
        (_frame(b"EPAB", _abort_body(1, b"x"), version=2), r"unsupported message version 2 \(AbortMessage\)"),
        (_frame(b"EPAB", _abort_body(1, b"x"), flags=1), "unknown flag bits 0x0001 for a AbortMessage"),
        (_frame(b"EPAB", b"\x01\x00\x00"), "AbortMessage truncated at offset 12: rank and reason length"),
        (_frame(b"EPAB", _abort_body(1, b"x", n=65535)), "abort reason length 65535 exceeds the maximum 4096"),
        (_frame(b"EPAB", _abort_body(1, b"x", n=4)), "AbortMessage truncated at offset 18: reason needs 4 bytes"),
        (_frame(b"EPAB", _abort_body(1, b"x") + b"\x00"), "1 bytes after its last field"),
        (_frame(b"EPAB", _abort_body(1, b"caf\xe9")), "abort reason is not valid UTF-8"),
        (_frame(b"EPAB", _abort_body(1, b"\xed\xa0\x80")), "abort reason is not valid UTF-8"),
        (_frame(b"EPAB", _abort_body(1, b"two\nlines")), r"single printable line, found '\\n'"),
        (_frame(b"EPAB", _abort_body(1, b"cr\rhere")), r"found '\\r'"),
        (_frame(b"EPAB", _abort_body(1, "sep\u2028".encode())), "category Zl"),
        (_frame(b"EPAB", _abort_body(1, b"\x1b[31mred")), r"found '\\x1b'"),
        (_frame(b"EPAB", _abort_body(1, b"")), "must not be empty or blank"),
        (_frame(b"EPAB", _abort_body(1, b" " * 5)), "must not be empty or blank"),
        (_frame(b"EPOS", b""), "OptimizerStateHeader truncated at offset 12: parameter count"),
        (_frame(b"EPOS", _state_body(n_params=2**32 - 1)), "parameter count 4294967295 exceeds the maximum 65536"),
        (_frame(b"EPOS", _state_body(n_params=3)), "parameter count 3 needs more than the 0 body bytes left"),
        (_frame(b"EPOS", _state_body([b""] * 3)[:4] + b"\xff\xff"), r"params\[0\] entry count 65535 exceeds"),
        (_frame(b"EPOS", struct.pack("<IH", 1, 9)), r"params\[0\] entry count 9 needs more than the 0 bytes left"),
        (_frame(b"EPOS", _state_body([_state_entry(9, b"k")])), "unknown entry kind code 9"),
        (_frame(b"EPOS", _state_body([struct.pack("<BB", 4, 200) + b"k"])), r"\[0\]\[0\] key needs 200 bytes"),
        (_frame(b"EPOS", _state_body([_state_entry(4, b"\xff")])), "key is not valid UTF-8"),
        (_frame(b"EPOS", _state_body([_state_entry(0, b"t", _tensor(200, 0, ()))])), "unknown .* dtype code 200"),
        (_frame(b"EPOS", _state_body([_state_entry(0, b"t", _tensor(0, 99, ()))])), "unknown .* device code 99"),
        (_frame(b"EPOS", _state_body([_state_entry(0, b"t", _tensor(0, 0, (), ndim=255))])), "255 dimensions"),
        (_frame(b"EPOS", _state_body([_state_entry(0, b"t", _tensor(0, 0, (), ndim=3))])), "shape needs 24 bytes"),
        (_frame(b"EPOS", _state_body([_state_entry(0, b"t", _tensor(0, 0, (2**64 - 1,)))])), "sizes that are ints"),
        (_frame(b"EPOS", _state_body([_state_entry(0, b"t", _tensor(0, 0, (2**62, 4)))])), "elements"),
        (_frame(b"EPOS", _state_body([_state_entry(3, b"b", b"\x02")])), "a bool is stored as 0 or 1, got 2"),
        (_frame(b"EPOS", _state_body([_state_entry(1, b"i", b"\x00" * 4)])), r"\[0\]\[0\] value needs 8 bytes"),
        (_frame(b"EPOS", _state_body([_state_entry(4, b"k"), _state_entry(4, b"k")])), "repeats the key 'k'"),
        (_frame(b"EPOS", _state_body([]) + b"\x00"), "1 bytes after its last field"),
        (_frame(b"EPOS", _state_body(), flags=2), "unknown flag bits 0x0002 for a OptimizerStateHeader"),
    ],
)
def test_hostile_input_says_what_is_wrong(data: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        decode_any(data)


def test_oversized_input_is_refused_before_the_kind_is_read() -> None:
    with pytest.raises(ProtocolError, match="more than the largest valid message"):
        decode_any(b"EPAB" + bytes(MAX_MESSAGE_BYTES))
    too_big = _frame(b"EPAB", _abort_body(1, b"x" * (MAX_REASON_BYTES + 1)))
    with pytest.raises(ProtocolError, match="AbortMessage has 4119 bytes, more than the largest valid one"):
        decode_any(too_big)


# --- the dataclasses --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "reason", "words"),
    [
        (-1, "x", "rank must be an int in"),
        (2**32, "x", "rank must be an int in"),
        (True, "x", "rank must be an int in"),
        (0, b"x", "reason must be a str, got bytes"),
        (0, "", "must not be empty"),
        (0, "a\nb", "single printable line"),
        (0, "tab\there", r"found '\\t'"),
        (0, "nel\x85", "single printable line"),
        (0, "\ud800", "not encodable as UTF-8"),
        (0, "\u00e9" * (MAX_REASON_BYTES // 2 + 1), "4098 UTF-8 bytes, more than the maximum 4096"),
    ],
)
def test_abort_validates_its_fields(rank: int, reason: str, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        AbortMessage(rank, reason)


def test_abort_from_text_makes_any_text_one_valid_line() -> None:
    assert AbortMessage.from_text(2, "bad\n  boundaries\t(0, 4)\r\n").reason == "bad boundaries (0, 4)"
    assert AbortMessage.from_text(2, "esc\x1b[0m and \ud800").reason == "esc\ufffd[0m and \ufffd"
    assert AbortMessage.from_text(2, " \n ").reason == "(no reason given)"
    long = AbortMessage.from_text(2, "\u00e9" * 5000)
    assert long.reason.endswith("...") and len(long.reason.encode()) <= MAX_REASON_BYTES
    assert decode_any(encode(long)) == long
    with pytest.raises(ProtocolError, match="rank must be"):
        AbortMessage.from_text(-1, "x")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"key": 1, "kind": "none"}, "key must be a str"),
        ({"key": "k" * (MAX_KEY_BYTES + 1), "kind": "none"}, "at most 255 UTF-8 bytes"),
        ({"key": "\udc80", "kind": "none"}, "encodable as UTF-8"),
        ({"key": "k", "kind": "number"}, "kind must be one of tensor, int, float, bool, none"),
        ({"key": "k", "kind": "tensor", "dtype": "float", "shape": (), "device": "cpu"}, "dtype must be one of"),
        ({"key": "k", "kind": "tensor", "dtype": "float32", "shape": (), "device": "gpu"}, "device must be one of"),
        ({"key": "k", "kind": "tensor", "dtype": "float32", "shape": [2], "device": "cpu"}, "shape must be a tuple"),
        ({"key": "k", "kind": "tensor", "dtype": "float32", "shape": (1,) * 65, "device": "cpu"}, "at most 64"),
        ({"key": "k", "kind": "tensor", "dtype": "float32", "shape": (-1,), "device": "cpu"}, "sizes that are"),
        ({"key": "k", "kind": "tensor", "dtype": "float32", "shape": (True,), "device": "cpu"}, "sizes that are"),
        ({"key": "k", "kind": "tensor", "dtype": "float32", "shape": (), "device": "cpu", "value": 1}, "None for a"),
        ({"key": "k", "kind": "int", "value": 1, "dtype": "float32"}, "dtype must be None for a int entry"),
        ({"key": "k", "kind": "int", "value": True}, "an int in"),
        ({"key": "k", "kind": "int", "value": 2**63}, "an int in"),
        ({"key": "k", "kind": "int", "value": 1.0}, "an int in"),
        ({"key": "k", "kind": "float", "value": 1}, "a float for a float entry"),
        ({"key": "k", "kind": "bool", "value": 1}, "a bool for a bool entry"),
        ({"key": "k", "kind": "none", "value": 0}, "None for a none entry"),
    ],
)
def test_state_entry_validates_its_fields(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        StateEntry(**fields)  # type: ignore[arg-type]


def test_state_entry_scalar_picks_the_kind_from_the_type() -> None:
    assert [StateEntry.scalar("k", v).kind for v in (True, 3, 3.0, None)] == ["bool", "int", "float", "none"]
    with pytest.raises(ProtocolError, match="optimizer state 'k' holds a str; only tensors, int, float, bool"):
        StateEntry.scalar("k", "adam")  # type: ignore[arg-type]


def test_header_validates_its_structure() -> None:
    none = StateEntry.scalar("k", None)
    with pytest.raises(ProtocolError, match="params must be a tuple of at most 65536 parameters, got list"):
        OptimizerStateHeader([()])  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="got tuple of length 65537"):
        OptimizerStateHeader(((),) * (MAX_STATE_PARAMS + 1))
    with pytest.raises(ProtocolError, match=r"params\[0\] must be a tuple of at most 256 StateEntry, got list"):
        OptimizerStateHeader(([none],))  # type: ignore[arg-type]
    many = tuple(StateEntry.scalar(str(i), None) for i in range(MAX_STATE_ENTRIES + 1))
    with pytest.raises(ProtocolError, match=r"params\[0\] must be a tuple of at most 256"):
        OptimizerStateHeader((many,))
    with pytest.raises(ProtocolError, match=r"params\[0\] must hold StateEntry values, got tuple"):
        OptimizerStateHeader(((("k", "none"),),))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"params\[0\] repeats the key 'k'"):
        OptimizerStateHeader(((none, none),))


def test_header_too_big_to_encode_is_refused_at_construction() -> None:
    wide = tuple(StateEntry.tensor(f"k{i:03d}" + "x" * 200, "float32", (1,) * 64) for i in range(MAX_STATE_ENTRIES))
    with pytest.raises(ProtocolError, match=f"more than the maximum {MAX_STATE_BYTES}"):
        OptimizerStateHeader((wide,) * 50)


def test_tensors_lists_tensor_entries_in_travel_order() -> None:
    assert ADAM.tensors() == ((0, ADAM.params[0][0]), (0, ADAM.params[0][1]))


def test_vocabularies_match_torch() -> None:
    torch = pytest.importorskip("torch")
    for name in DTYPE_NAMES:
        dtype = getattr(torch, name, None)
        if dtype is None:  # a dtype newer than the installed torch
            continue
        assert isinstance(dtype, torch.dtype) and str(dtype) == f"torch.{name}"
    assert str(torch.tensor(0.0).device.type) in DEVICE_TYPES
    assert len(set(DTYPE_NAMES)) == len(DTYPE_NAMES) < 256 and len(DEVICE_TYPES) < 256
    assert ENTRY_KINDS == ("tensor", "int", "float", "bool", "none")
    assert MAX_NDIM == 64


def test_a_nan_scalar_travels() -> None:
    header = OptimizerStateHeader(((StateEntry.scalar("best", math.nan), StateEntry.scalar("top", -math.inf)),))
    best, top = decode(encode(header), OptimizerStateHeader).params[0]
    assert isinstance(best.value, float) and math.isnan(best.value) and top.value == -math.inf
