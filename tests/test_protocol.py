"""elastic_pipe.protocol: the v1 codec, the published 50-float message, and ``elastic-pipe decode``."""

from __future__ import annotations

import io
import json
import math
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.cli import main
from elastic_pipe.protocol import (
    LEGACY_LENGTH,
    MAGIC,
    MAX_MESSAGE_BYTES,
    MAX_RANKS,
    TRANSITION_VERSION,
    LegacyMessage,
    ProtocolError,
    TransitionMessage,
    decode,
    decode_legacy,
    describe,
    describe_legacy,
    encode,
    encode_legacy,
    message_to_dict,
)
from elastic_pipe.types import ElasticPipeError

SETTINGS = settings(max_examples=60, deadline=None)

EXAMPLE = TransitionMessage(
    epoch=3,
    step=1200,
    frozen=4,
    pipe_len=2,
    boundaries=(4, 8, 12),
    microbatches=16,
    max_cost_at_start=21.5,
    changed_ranks=(1, 9),
    grad_norms=(0.5, 0.25),
)


@st.composite
def messages(draw: st.DrawFn) -> TransitionMessage:
    frozen = draw(st.integers(0, 50))
    pipe_len = draw(st.integers(1, 8))
    virtual = draw(st.integers(1, 3))
    stages = pipe_len * virtual
    cuts = draw(st.lists(st.integers(frozen + 1, frozen + 100), min_size=stages, max_size=stages, unique=True))
    finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
    return TransitionMessage(
        epoch=draw(st.integers(0, 2**64 - 1)),
        step=draw(st.integers(0, 2**64 - 1)),
        frozen=frozen,
        pipe_len=pipe_len,
        boundaries=(frozen, *sorted(cuts)),
        microbatches=draw(st.integers(1, 2**32 - 1)),
        max_cost_at_start=draw(finite),
        changed_ranks=tuple(sorted(draw(st.sets(st.integers(0, 2**32 - 1), max_size=20)))),
        grad_norms=draw(st.none() | st.lists(finite, max_size=30).map(tuple)),
        virtual=virtual,
    )


def _with_crc(head_body: bytes) -> bytes:
    return head_body + struct.pack("<I", zlib.crc32(head_body))


def _forge(**fields: int | float) -> bytes:
    """A v1 message built by hand from the documented layout (not by ``encode``), with a correct CRC."""
    f: dict[str, int | float] = {
        "epoch": 1,
        "step": 2,
        "frozen": 0,
        "pipe_len": 1,
        "microbatches": 1,
        "max_cost": 1.0,
        "n_bounds": 2,
        "n_changed": 0,
        "n_norms": 0,
        "flags": 0,
    }
    f.update(fields)
    body = struct.pack(
        "<QQIIIdIII",
        f["epoch"],
        f["step"],
        f["frozen"],
        f["pipe_len"],
        f["microbatches"],
        f["max_cost"],
        f["n_bounds"],
        f["n_changed"],
        f["n_norms"],
    ) + struct.pack("<2I", 0, 5)
    return _with_crc(struct.pack("<4sHHI", MAGIC, 1, f["flags"], len(body)) + body)


# --- the binary codec -------------------------------------------------------------------------------------------


def test_encoding_follows_the_documented_layout() -> None:
    data = encode(EXAMPLE)
    assert data[:4] == b"EPTM"
    assert struct.unpack_from("<HHI", data, 4) == (2, 1, len(data) - 16)
    assert struct.unpack_from("<QQIIIdIIII", data, 12) == (3, 1200, 4, 2, 16, 21.5, 3, 2, 2, 1)
    assert struct.unpack_from("<3I2I2d", data, 64) == (4, 8, 12, 1, 9, 0.5, 0.25)
    assert struct.unpack_from("<I", data, len(data) - 4)[0] == zlib.crc32(data[:-4])
    assert len(data) == 12 + 52 + 5 * 4 + 2 * 8 + 4


def test_virtual_stages_travel_in_version_2() -> None:
    msg = TransitionMessage(3, 9, 2, 2, (2, 4, 5, 8, 9), 4, 1.5, (1,), None, virtual=2)
    data = encode(msg)
    assert struct.unpack_from("<H", data, 4) == (TRANSITION_VERSION,)
    assert struct.unpack_from("<I", data, 60) == (2,)
    assert struct.unpack_from("<5I", data, 64) == (2, 4, 5, 8, 9)
    assert decode(data) == msg and decode(data).layers_per_stage == (2, 1, 3, 1)
    assert message_to_dict(msg)["virtual"] == 2
    assert "stages per device: 2 (4 stages in all)" in _words(describe(msg))


def test_version_1_message_decodes_to_one_stage_per_rank() -> None:
    """A sender that predates virtual stages writes version 1 (no ``virtual`` field): it reads as v = 1."""
    old = _forge(pipe_len=1, n_bounds=2)
    assert struct.unpack_from("<H", old, 4) == (1,)
    msg = decode(old)
    assert msg.virtual == 1 and msg.boundaries == (0, 5)
    # the same fields re-encoded are version 2 and differ from the old bytes only by the version and the field
    assert decode(encode(msg)) == msg and len(encode(msg)) == len(old) + 4
    with pytest.raises(ProtocolError, match=r"boundary count 2 does not match pipe_len \* virtual \+ 1 = 3"):
        decode(_forge(pipe_len=2, n_bounds=2))


def test_hand_built_message_decodes() -> None:
    msg = decode(_forge())
    assert msg == TransitionMessage(1, 2, 0, 1, (0, 5), 1, 1.0, (), None)


def test_none_and_empty_grad_norms_stay_distinct() -> None:
    empty = TransitionMessage(0, 0, 0, 1, (0, 1), 1, 0.0, (), ())
    none = TransitionMessage(0, 0, 0, 1, (0, 1), 1, 0.0, (), None)
    assert decode(encode(empty)).grad_norms == ()
    assert decode(encode(none)).grad_norms is None


@SETTINGS
@given(messages())
def test_round_trip_is_exact(msg: TransitionMessage) -> None:
    data = encode(msg)
    assert decode(data) == msg
    assert decode(bytearray(data)) == msg
    assert decode(memoryview(data)) == msg
    assert encode(decode(data)) == data


@SETTINGS
@given(messages(), st.data())
def test_any_single_byte_change_is_a_protocol_error(msg: TransitionMessage, data: st.DataObject) -> None:
    raw = bytearray(encode(msg))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    # CRC32 detects every single-byte error, and changes to magic, version or length fail before it.
    with pytest.raises(ProtocolError):
        decode(bytes(raw))


@SETTINGS
@given(messages(), st.data())
def test_truncation_and_trailing_bytes_are_protocol_errors(msg: TransitionMessage, data: st.DataObject) -> None:
    raw = encode(msg)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(ProtocolError):
        decode(raw[:cut])
    with pytest.raises(ProtocolError):
        decode(raw + data.draw(st.binary(min_size=1, max_size=8)))


@SETTINGS
@given(messages(), st.data())
def test_mutations_behind_a_valid_crc_decode_canonically_or_raise(msg: TransitionMessage, data: st.DataObject) -> None:
    raw = bytearray(encode(msg)[:-4])
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    forged = _with_crc(bytes(raw))
    try:
        decoded = decode(forged)
    except ProtocolError:
        return
    assert encode(decoded) == forged


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(raw)
    with pytest.raises(ProtocolError):
        decode(MAGIC + struct.pack("<HH", 1, 0) + raw)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "truncated"),
        (b"XXXX" + encode(EXAMPLE)[4:], "wrong magic"),
        (encode(EXAMPLE)[:4] + b"\x03" + encode(EXAMPLE)[5:], "unsupported message version 3"),
        (encode(EXAMPLE)[:-1] + bytes([encode(EXAMPLE)[-1] ^ 1]), "CRC32 mismatch"),
        (encode(EXAMPLE)[:-5], "length prefix"),
        (encode(EXAMPLE) + b"\x00", "length prefix"),
        (_forge(n_changed=2**32 - 1), f"changed-rank count 4294967295 exceeds the maximum {MAX_RANKS}"),
        (_forge(n_norms=2**32 - 1, flags=1), "gradient-norm count"),
        (_forge(n_bounds=5), "boundary count 5 does not match pipe_len . virtual + 1 = 2"),
        (_forge(pipe_len=2**32 - 1, n_bounds=0), "boundary count"),
        (_forge(n_changed=3), "counts need a body of"),
        (_forge(n_norms=1), "flag is not set"),
        (_forge(flags=6), "unknown flag bits"),
        (_forge(max_cost=math.nan), "max_cost_at_start must be finite"),
        (_forge(max_cost=-1.0), "max_cost_at_start must be finite"),
        (_forge(microbatches=0), "microbatches must be in"),
        (_forge(frozen=3), "must start at frozen=3"),
    ],
)
def test_malformed_input_says_what_is_wrong(data: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words.replace("+", r"\+")):
        decode(data)


def test_oversized_input_is_rejected_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="more than the largest valid message"):
        decode(bytes(MAX_MESSAGE_BYTES + 1))


def test_decode_and_encode_reject_wrong_types() -> None:
    with pytest.raises(ProtocolError, match="data must be bytes, got str"):
        decode("4550544d")  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="msg must be a TransitionMessage"):
        encode(object())  # type: ignore[arg-type]


def test_protocol_error_is_in_the_toolkit_family() -> None:
    assert issubclass(ProtocolError, ElasticPipeError) and issubclass(ProtocolError, ValueError)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"boundaries": (4, 8)}, "pipe_len \\* virtual \\+ 1 = 3"),
        ({"virtual": 2}, "pipe_len \\* virtual \\+ 1 = 5"),
        ({"virtual": 0}, "virtual must be in \\[1, 32768\\]"),
        ({"virtual": 2**15 + 1}, "virtual must be in"),
        ({"virtual": 2.0}, "virtual must be an int"),
        ({"boundaries": (0, 8, 12)}, "must start at frozen=4"),
        ({"boundaries": (4, 8, 8)}, "strictly increase"),
        ({"pipe_len": 0, "boundaries": (4,)}, "pipe_len must be in"),
        ({"epoch": -1}, "epoch must be in"),
        ({"step": True}, "step must be an int"),
        ({"max_cost_at_start": math.inf}, "finite"),
        ({"changed_ranks": (9, 1)}, "distinct and increasing"),
        ({"changed_ranks": [1, 9]}, "must be a tuple"),
        ({"changed_ranks": 5}, "must be a tuple of at most 1048576 ranks, got int"),
        ({"grad_norms": (0.5, math.nan)}, "grad_norms"),
        ({"grad_norms": (-0.5,)}, "grad_norms"),
    ],
)
def test_message_validates_its_fields(changes: dict[str, object], words: str) -> None:
    fields = {**message_to_dict(EXAMPLE), "boundaries": EXAMPLE.boundaries, "changed_ranks": EXAMPLE.changed_ranks}
    fields["grad_norms"] = EXAMPLE.grad_norms
    fields.update(changes)
    with pytest.raises(ProtocolError, match=words):
        TransitionMessage(**fields)  # type: ignore[arg-type]


def test_message_properties() -> None:
    assert EXAMPLE.layers_per_stage == (4, 4)
    assert EXAMPLE.active_layers == 8


def _words(text: str) -> str:
    return " ".join(text.split())


def test_describe_spells_out_every_field() -> None:
    text = _words(describe(EXAMPLE))
    for words in (
        "takes effect at: epoch 3, step 1200",
        "frozen layers: 4 (layers 0-3 no longer train)",
        "pipeline length: 2 (each pipeline replica spans 2 devices)",
        "stages per device: 1 (2 stages in all)",
        "stage boundaries: [4, 8, 12] (stage 0: layers 4-7; stage 1: layers 8-11)",
        "micro-batches: 16 per step and pipeline replica",
        "largest per-device cost at the start: 21.5",
        "ranks whose role changes: 1, 9",
        "gradient norms: 2 values: 0.5, 0.25",
    ):
        assert words in text


# --- the published 50-float message -----------------------------------------------------------------------------

PUBLISHED = [4.0, 4.0, 21.3, 1.0, 2.0, 1.0, 9.0, 0.5, 0.0, 0.25] + [0.0] * 40


def test_encode_legacy_writes_the_published_layout() -> None:
    msg = LegacyMessage(4, 4, 21.3, 1, (1, 9), (0.5, 0.0, 0.25))
    assert encode_legacy(msg) == PUBLISHED
    none = encode_legacy(LegacyMessage(2, 8, 10.0, 0, (), None))
    assert none == [2.0, 8.0, 10.0, 0.0, 0.0, -1.0] + [0.0] * 44


def test_decode_legacy_reads_the_published_layout() -> None:
    assert decode_legacy(PUBLISHED) == LegacyMessage(4, 4, 21.3, 1, (1, 9), (0.5, 0.0, 0.25))
    assert decode_legacy([2, 8, 10, 0, 0, -1] + [0] * 44) == LegacyMessage(2, 8, 10.0, 0, (), None)


def test_decode_legacy_grad_norm_count_rule() -> None:
    # Trailing zeros are padding: a last norm of exactly 0.0 cannot be told apart from it ...
    values = encode_legacy(LegacyMessage(1, 2, 3.0, 4, (5,), (0.5, 0.0)))
    assert decode_legacy(values).grad_norms == (0.5,)
    # ... unless the caller knows L.
    assert decode_legacy(values, num_layers=2).grad_norms == (0.5, 0.0)
    assert decode_legacy([1, 2, 3, 4, 0] + [0] * 45).grad_norms == ()
    assert decode_legacy([1, 2, 3, 4, 0] + [0] * 45, num_layers=3).grad_norms == (0.0, 0.0, 0.0)


@st.composite
def legacy_messages(draw: st.DrawFn) -> LegacyMessage:
    ranks = tuple(draw(st.lists(st.integers(0, 4096), unique=True, max_size=20)))
    room = LEGACY_LENGTH - 5 - len(ranks)
    finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
    last = st.floats(min_value=1e-6, max_value=1e6)
    norms = draw(st.none() | st.tuples(st.lists(finite, max_size=room - 1), last).map(lambda t: (*t[0], t[1])))
    return LegacyMessage(
        num_frozen_layers=draw(st.integers(0, 100)),
        pipe_len=draw(st.integers(1, 64)),
        max_params_per_gpu=draw(finite),
        epoch=draw(st.integers(0, 10_000)),
        new_ranks=ranks,
        grad_norms=norms,
    )


@SETTINGS
@given(legacy_messages())
def test_legacy_round_trip(msg: LegacyMessage) -> None:
    values = encode_legacy(msg)
    assert len(values) == LEGACY_LENGTH
    assert decode_legacy(values) == msg


@SETTINGS
@given(legacy_messages(), st.data())
def test_legacy_mutations_raise_only_protocol_error(msg: LegacyMessage, data: st.DataObject) -> None:
    values: list[float] = encode_legacy(msg)
    i = data.draw(st.integers(0, LEGACY_LENGTH - 1))
    values[i] = data.draw(st.sampled_from([math.nan, math.inf, -1.0, -2.5, 0.5, 1e300, 3.0]))
    try:
        decoded = decode_legacy(values)
    except ProtocolError:
        return
    assert len(encode_legacy(decoded)) == LEGACY_LENGTH


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (PUBLISHED[:49], "exactly 50 floats, got 49"),
        ([*PUBLISHED[:4], math.nan, *PUBLISHED[5:]], r"value \[4\] is nan"),
        ([math.inf, *PUBLISHED[1:]], r"value \[0\] is inf"),
        ([4.5, *PUBLISHED[1:]], r"value \[0\] \(number of frozen layers\) must be a whole number"),
        ([4.0, 0.0, *PUBLISHED[2:]], r"value \[1\] \(new pipeline length\)"),
        ([4.0, 4.0, -1.0, *PUBLISHED[3:]], r"value \[2\]"),
        ([*PUBLISHED[:4], 46.0, *PUBLISHED[5:]], r"value \[4\] \(number of new ranks\) .* \[0, 45\]"),
        ([*PUBLISHED[:5], 9.0, 9.0, *PUBLISHED[7:]], "repeat a rank"),
        ([*PUBLISHED[:5], -1.0, *PUBLISHED[6:]], r"value \[5\] \(a newly activated rank\)"),
        ([*PUBLISHED[:7], -0.5, *PUBLISHED[8:]], r"value \[7\] \(a gradient norm\) must be >= 0"),
        ([1, 2, 3, 4, 0, -1, 0.5] + [0] * 43, r"value \[6\] must be 0.0 padding"),
        ([*PUBLISHED[:5], "1", *PUBLISHED[6:]], r"value \[5\] is not a number"),
        ([*PUBLISHED[:5], True, *PUBLISHED[6:]], r"value \[5\] is not a number"),
        ("1,2,3", "sequence of numbers"),
    ],
)
def test_legacy_rejects_what_does_not_fit(values: list[float], words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        decode_legacy(values)


def test_legacy_num_layers_must_fit() -> None:
    with pytest.raises(ProtocolError, match="num_layers=44"):
        decode_legacy(PUBLISHED, num_layers=44)
    with pytest.raises(ProtocolError, match=r"value \[9\] must be 0.0 padding, got 0.25"):
        decode_legacy(PUBLISHED, num_layers=1)


def test_legacy_message_must_fit_fifty_floats() -> None:
    with pytest.raises(ProtocolError, match="needs 51 floats"):
        LegacyMessage(0, 1, 0.0, 0, tuple(range(45)), None)
    assert len(encode_legacy(LegacyMessage(0, 1, 0.0, 0, tuple(range(45)), ()))) == 50
    with pytest.raises(ProtocolError, match="distinct"):
        LegacyMessage(0, 1, 0.0, 0, (3, 3))
    with pytest.raises(ProtocolError, match="pipe_len"):
        LegacyMessage(0, 0, 0.0, 0)


def test_describe_legacy_names_every_index() -> None:
    text = _words(describe_legacy(decode_legacy(PUBLISHED)))
    for words in (
        "[0] frozen layers: 4 (layers 0-3 no longer train)",
        "[1] pipeline length: 4 (each pipeline now spans 4 GPUs)",
        "[2] largest per-GPU size at the start: 21.3 million parameters",
        "[3] epoch: 1",
        "[4] newly added ranks: 2",
        "[5:7] those ranks: 1, 9",
        "[7:10] gradient norms: 3 values: 0.5, 0, 0.25",
        "[10:50] padding: all 0.0",
    ):
        assert words in text


# --- elastic-pipe decode ----------------------------------------------------------------------------------------


def test_cli_decode_v1_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    hexed = encode(EXAMPLE).hex()
    assert main(["decode", hexed]) == 0
    assert "stage 0: layers 4-7" in capsys.readouterr().out
    assert main(["decode", "0x" + hexed.upper(), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == message_to_dict(EXAMPLE)


def test_cli_decode_reads_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(encode(EXAMPLE).hex() + "\n"))
    assert main(["decode", "-", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["boundaries"] == [4, 8, 12]


def test_cli_decode_legacy_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    text = "[" + ", ".join(str(v) for v in PUBLISHED) + "]"
    assert main(["decode", "--legacy", text, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "num_frozen_layers": 4,
        "pipe_len": 4,
        "max_params_per_gpu": 21.3,
        "epoch": 1,
        "new_ranks": [1, 9],
        "grad_norms": [0.5, 0.0, 0.25],
    }
    none = ",".join(str(v) for v in [2, 8, 10, 0, 0, -1] + [0] * 44)
    assert main(["decode", "--legacy", none, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["grad_norms"] is None
    assert main(["decode", "--legacy", none]) == 0
    assert "[5] gradient norms: none sent (the -1 marker)" in _words(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["decode", "xyz"], "not hex"),
        (["decode", "00ff"], "truncated"),
        (["decode", "--legacy", "1, 2, nan"], "exactly 50 floats"),
        (["decode", "--legacy", ",".join(["nan"] * 50)], "value [0] is nan"),
        (["decode", "--legacy", "1, two"], "item 1 is not a number"),
        (["decode", "--legacy", "[]"], "empty"),
        (["decode", encode(EXAMPLE).hex(), "--num-layers", "3"], "only applies to --legacy"),
    ],
)
def test_cli_decode_bad_input_is_one_line_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and words in captured.err
