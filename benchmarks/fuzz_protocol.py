"""Fuzz the control-message decoders (transition, abort, optimizer-state header) with random and mutated inputs.

Not a ``bench_*`` script, so ``nox -s bench`` does not run it by default. Run it as::

    python benchmarks/fuzz_protocol.py [--inputs 1000000] [--seed 0]

Each input goes to :func:`elastic_pipe.protocol.decode_any` (v1 bytes of any kind) or :func:`decode_legacy`
(50-float lists). Outcomes are counted as: decoded, ProtocolError, or any other exception (a failure; target 0).
A v1 input that decodes must also re-encode to the same bytes (the encoding is canonical); a mismatch counts as a
failure too.
Results go to ``benchmarks/results/fuzz_protocol.json``.

Input families (equal shares, drawn from one seeded ``random.Random``):

* ``random_bytes``: uniform random bytes, 0-200 long, half of them behind a correct magic and version;
* ``mutated``: a valid encoding with 1-4 byte flips, insertions, deletions, truncation or extension;
* ``mutated_crc_fixed``: the same mutations, then the CRC recomputed, so corrupted counts and fields get past the
  checksum and reach the field checks;
* ``forged_counts``: a well-formed header and checksum around random fixed fields and counts (up to 2**32-1);
* ``legacy``: published 50-float messages, valid or mutated (NaN and infinities, fractional counts, negative
  values, wrong lengths, non-zero padding);
* ``abort_mutated``: valid abort encodings, mutated as above, half of them with the CRC recomputed;
* ``abort_forged``: a valid ``b"EPAB"`` frame and CRC around a random rank, a reason length that may lie (up to
  65,535) and a reason that is valid text, text with newlines, controls or separators, or random bytes (often
  not UTF-8);
* ``state_mutated``: valid optimizer-state headers, mutated, half of them with the CRC recomputed;
* ``state_forged``: a valid ``b"EPOS"`` frame and CRC around a body built entry by entry with forged values:
  parameter and entry counts up to 2**32-1, kind, dtype and device codes out of range, key lengths and ndim that
  overrun, non-UTF-8 keys, bool bytes other than 0 and 1, repeated keys, dimensions up to 2**64-1, trailing bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_pipe.protocol import (
    DEVICE_TYPES,
    DTYPE_NAMES,
    MAGIC,
    VERSION,
    AbortMessage,
    LegacyMessage,
    OptimizerStateHeader,
    ProtocolError,
    StateEntry,
    TransitionMessage,
    decode_any,
    decode_legacy,
    encode,
    encode_legacy,
)

RESULTS = Path(__file__).resolve().parent / "results" / "fuzz_protocol.json"
DEFAULT_INPUTS = 1_000_000
#: Keep the first few unexpected failures verbatim so they can be reproduced.
KEEP_EXAMPLES = 10
_FAMILIES = (
    "random_bytes",
    "mutated",
    "mutated_crc_fixed",
    "forged_counts",
    "legacy",
    "abort_mutated",
    "abort_forged",
    "state_mutated",
    "state_forged",
)
ABORT_MAGIC = b"EPAB"
STATE_MAGIC = b"EPOS"
#: Reason texts for forged aborts: fine, multi-line, with controls or separators, blank.
_REASONS = ("rank 0 could not decide", "two\nlines", "cr\r", "tab\t", "\x1b[31m", "sep\u2028", "   ", "", "caf\u00e9")


def _valid_message(rng: random.Random) -> TransitionMessage:
    pipe_len = rng.choice((1, 2, 4, 8, 16))
    virtual = rng.choice((1, 2))
    frozen = rng.randrange(0, 24)
    cuts = sorted(rng.sample(range(frozen + 1, frozen + 64), pipe_len * virtual))
    norms = None if rng.random() < 0.3 else tuple(rng.uniform(0, 10) for _ in range(rng.randrange(0, 30)))
    return TransitionMessage(
        epoch=rng.randrange(0, 1000),
        step=rng.randrange(0, 10**9),
        frozen=frozen,
        pipe_len=pipe_len,
        boundaries=(frozen, *cuts),
        microbatches=rng.randrange(1, 129),
        max_cost_at_start=rng.uniform(0, 1e9),
        changed_ranks=tuple(sorted(rng.sample(range(64), rng.randrange(0, 16)))),
        grad_norms=norms,
        virtual=virtual,
    )


def _valid_abort(rng: random.Random) -> AbortMessage:
    words = " ".join(
        rng.choice(("stage", "boundary", "\u00e9t\u00e9", "3", "(0, 4)")) for _ in range(rng.randrange(1, 30))
    )
    return AbortMessage(rng.randrange(0, 1 << 32), words)


def _valid_state(rng: random.Random) -> OptimizerStateHeader:
    params = []
    for _ in range(rng.randrange(0, 12)):
        entries = [StateEntry.tensor("step", "float32", (), "cpu")] if rng.random() < 0.7 else []
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")[: rng.randrange(0, 4)]:
            shape = tuple(rng.randrange(1, 4096) for _ in range(rng.randrange(0, 4)))
            entries.append(StateEntry.tensor(key, rng.choice(DTYPE_NAMES), shape, rng.choice(DEVICE_TYPES)))
        for key, value in (("n", rng.randrange(-(1 << 63), 1 << 63)), ("lr", rng.uniform(-1, 1)), ("on", True)):
            if rng.random() < 0.3:
                entries.append(StateEntry.scalar(key, value))
        if rng.random() < 0.2:
            entries.append(StateEntry.scalar("nothing", None))
        params.append(tuple(entries))
    return OptimizerStateHeader(tuple(params))


def _frame(rng: random.Random, magic: bytes, body: bytes) -> bytes:
    flags = 0 if rng.random() < 0.9 else 1  # the new kinds define no flags
    head_body = struct.pack("<4sHHI", magic, VERSION, flags, len(body)) + body
    return head_body + struct.pack("<I", zlib.crc32(head_body))


def _forged_abort(rng: random.Random) -> bytes:
    # Half the reasons are text (some of it not one line), half random bytes (often not UTF-8).
    reason = rng.choice(_REASONS).encode("utf-8") if rng.random() < 0.5 else rng.randbytes(rng.randrange(0, 64))
    n = len(reason) if rng.random() < 0.7 else rng.choice((0, len(reason) + 1, 4096, 4097, 65535))
    return _frame(rng, ABORT_MAGIC, struct.pack("<IH", rng.randrange(1 << 32), n) + reason)


def _forged_state(rng: random.Random) -> bytes:
    def small(limit: int, honest: int) -> int:
        return honest if rng.random() < 0.8 else rng.choice((0, honest + 1, limit - 1, rng.randrange(limit)))

    n_params = rng.randrange(0, 5)
    out = [struct.pack("<I", small(1 << 32, n_params))]
    for _ in range(n_params):
        n_entries = rng.randrange(0, 5)
        out.append(struct.pack("<H", small(1 << 16, n_entries)))
        for _ in range(n_entries):
            kind = small(256, rng.randrange(5))
            key = rng.choice((b"step", b"exp_avg", b"k", b"\xff\xfe", b"", rng.randbytes(3)))
            out.append(struct.pack("<BB", kind, small(256, len(key))) + key)
            if kind == 0:
                shape = [rng.choice((0, 1, 768, (1 << 63) - 1, (1 << 64) - 1)) for _ in range(rng.randrange(0, 4))]
                dtype = small(256, rng.randrange(len(DTYPE_NAMES)))
                device = small(256, rng.randrange(len(DEVICE_TYPES)))
                out.append(struct.pack(f"<BBB{len(shape)}Q", dtype, device, small(256, len(shape)), *shape))
            elif kind in (1, 2):
                out.append(rng.randbytes(8))
            elif kind == 3:
                out.append(bytes([small(256, rng.randrange(2))]))
    if rng.random() < 0.1:
        out.append(rng.randbytes(rng.randrange(1, 8)))
    return _frame(rng, STATE_MAGIC, b"".join(out))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[pos % len(buf)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos % len(buf)] = rng.randrange(256)
        elif op == 2:
            buf.insert(pos, rng.randrange(256))
        elif op == 3 and buf:
            del buf[pos % len(buf)]
        elif op == 4:
            del buf[pos:]
        else:
            buf.extend(rng.randbytes(rng.randrange(1, 16)))
    return bytes(buf)


def _fix_crc(data: bytes) -> bytes:
    if len(data) < 4:
        return data
    body = data[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def _random_bytes(rng: random.Random) -> bytes:
    data = rng.randbytes(rng.randrange(0, 200))
    if rng.random() < 0.5:
        data = MAGIC + struct.pack("<HH", VERSION, rng.randrange(4)) + data
    return data


def _forged_counts(rng: random.Random) -> bytes:
    def count() -> int:
        return rng.choice((0, 1, 2, 3, rng.randrange(1 << 16), rng.randrange(1 << 32), (1 << 32) - 1))

    fixed = struct.pack(
        "<QQIIIdIII",
        rng.randrange(1 << 64),
        rng.randrange(1 << 64),
        count(),
        count(),
        count(),
        rng.choice((0.0, -1.0, math.nan, math.inf, rng.uniform(0, 1e6))),
        count(),
        count(),
        count(),
    )
    body = fixed + rng.randbytes(rng.randrange(0, 128))
    length = len(body) if rng.random() < 0.8 else count()
    head_body = struct.pack("<4sHHI", MAGIC, VERSION, rng.randrange(4), length) + body
    return head_body + struct.pack("<I", zlib.crc32(head_body))


def _legacy(rng: random.Random) -> list[Any]:
    n = rng.randrange(0, 10)
    norms = None if rng.random() < 0.3 else tuple(rng.uniform(0, 5) for _ in range(rng.randrange(0, 20)))
    values: list[Any] = encode_legacy(
        LegacyMessage(
            num_frozen_layers=rng.randrange(0, 24),
            pipe_len=rng.choice((1, 2, 4, 8)),
            max_params_per_gpu=rng.uniform(0, 100),
            epoch=rng.randrange(0, 100),
            new_ranks=tuple(rng.sample(range(64), n)),
            grad_norms=norms,
        )
    )
    for _ in range(rng.randrange(0, 4)):
        op = rng.randrange(5)
        i = rng.randrange(len(values)) if values else 0
        if op == 0 and values:
            values[i] = rng.choice((math.nan, math.inf, -math.inf, -1.0, 0.5, 1e300, -0.0))
        elif op == 1 and values:
            values[i] = rng.uniform(-100, 100)
        elif op == 2 and values:
            values[i] = float(rng.randrange(-3, 60))
        elif op == 3:
            del values[i:]
        else:
            values.append(rng.choice((0.0, 1.0, math.nan)))
    return values


def _run_v1(data: bytes) -> str:
    msg = decode_any(data)
    if encode(msg) != data:
        raise AssertionError(f"decoded but does not re-encode to the same bytes: {data.hex()}")
    return "decoded"


def main(argv: list[str] | None = None) -> int:
    """Run the fuzz campaign, print a table and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=DEFAULT_INPUTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    outcomes: dict[str, Counter[str]] = {f: Counter() for f in _FAMILIES}
    examples: list[dict[str, str]] = []
    valid = [encode(_valid_message(rng)) for _ in range(256)]
    aborts = [encode(_valid_abort(rng)) for _ in range(256)]
    states = [encode(_valid_state(rng)) for _ in range(256)]

    def mutated(pool: list[bytes]) -> bytes:
        data = _mutate(rng, rng.choice(pool))
        return _fix_crc(data) if rng.random() < 0.5 else data

    makers: dict[str, Callable[[], tuple[Callable[[Any], Any], Any]]] = {
        "random_bytes": lambda: (_run_v1, _random_bytes(rng)),
        "mutated": lambda: (_run_v1, _mutate(rng, rng.choice(valid))),
        "mutated_crc_fixed": lambda: (_run_v1, _fix_crc(_mutate(rng, rng.choice(valid)))),
        "forged_counts": lambda: (_run_v1, _forged_counts(rng)),
        "legacy": lambda: (decode_legacy, _legacy(rng)),
        "abort_mutated": lambda: (_run_v1, mutated(aborts)),
        "abort_forged": lambda: (_run_v1, _forged_abort(rng)),
        "state_mutated": lambda: (_run_v1, mutated(states)),
        "state_forged": lambda: (_run_v1, _forged_state(rng)),
    }
    start = time.perf_counter()
    for i in range(args.inputs):
        family = _FAMILIES[i % len(_FAMILIES)]
        fn, value = makers[family]()
        try:
            fn(value)
            outcomes[family]["decoded"] += 1
        except ProtocolError:
            outcomes[family]["protocol_error"] += 1
        except Exception as exc:
            outcomes[family]["other_failure"] += 1
            if len(examples) < KEEP_EXAMPLES:
                shown = value.hex() if isinstance(value, bytes) else repr(value)
                examples.append({"family": family, "error": f"{type(exc).__name__}: {exc}", "input": shown})
    seconds = time.perf_counter() - start
    failures = sum(c["other_failure"] for c in outcomes.values())
    result = {
        "inputs": args.inputs,
        "seed": args.seed,
        "seconds": round(seconds, 1),
        "other_failures": failures,
        "by_family": {f: dict(c) for f, c in outcomes.items()},
        "failure_examples": examples,
        "python": sys.version.split()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{'family':<20}{'decoded':>10}{'ProtocolError':>15}{'other':>8}")
    for f, c in outcomes.items():
        print(f"{f:<20}{c['decoded']:>10}{c['protocol_error']:>15}{c['other_failure']:>8}")
    print(f"{args.inputs} inputs in {seconds:.0f} s; failures other than ProtocolError: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
