"""Decode a transition message in plain words.

MESSAGE is the hex of a v1 message (what elastic_pipe logs; an optional 0x prefix and spaces are allowed), or with
--legacy the published PipeTransformer message: 50 comma-separated numbers, brackets allowed, as its logs print
them. Every field is spelled out: what was frozen, the new pipeline length (how many devices each pipeline replica
now spans), the newly added ranks (processes that start a new replica), and the gradient norms. A MESSAGE of -
is read from stdin.

With --legacy the number of gradient norms is not in the message: they are read as the values after the new
ranks up to the last non-zero one (pass --num-layers L to read exactly L).
"""

from __future__ import annotations

import argparse
import binascii
import sys

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit
from elastic_pipe.protocol import (
    ProtocolError,
    decode,
    decode_legacy,
    describe,
    describe_legacy,
    legacy_to_dict,
    message_to_dict,
)

HELP = "Decode a transition message (v1 hex or the published 50-float form) in plain words."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument(
        "message",
        metavar="MESSAGE",
        help="v1 message as hex, or with --legacy 50 comma-separated floats; - reads it from stdin",
    )
    parser.add_argument("--legacy", action="store_true", help="MESSAGE is the published 50-float PipeTransformer list")
    parser.add_argument(
        "--num-layers",
        type=int,
        default=None,
        metavar="L",
        help="with --legacy: the number of per-layer gradient norms, when known",
    )
    add_json_flag(parser)


def parse_floats(text: str) -> list[float]:
    """Parse ``"[1.0, 2, 3e-1]"`` or ``"1.0,2,3e-1"`` into floats (``nan``/``inf`` are parsed, then rejected)."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    if not body.strip():
        raise CliInputError("MESSAGE is empty; expected 50 comma-separated numbers")
    values = []
    for i, item in enumerate(body.split(",")):
        try:
            values.append(float(item.strip()))
        except ValueError:
            raise CliInputError(f"MESSAGE item {i} is not a number: {item.strip()!r}") from None
    return values


def parse_hex(text: str) -> bytes:
    """Parse hex with an optional ``0x`` prefix and any whitespace."""
    body = "".join(text.split())
    if body[:2].lower() == "0x":
        body = body[2:]
    try:
        return binascii.unhexlify(body)
    except (binascii.Error, ValueError):
        raise ProtocolError(
            f"MESSAGE is not hex ({len(body)} characters); pass --legacy for the published 50-float form"
        ) from None


def run(args: argparse.Namespace) -> int:
    """Decode MESSAGE and print it."""
    if args.message == "-":
        args.message = sys.stdin.read()
    if args.legacy:
        values = parse_floats(args.message)
        if args.num_layers is not None and args.num_layers < 0:
            raise CliInputError(f"--num-layers must be >= 0, got {args.num_layers}")
        legacy = decode_legacy(values, num_layers=args.num_layers)
        emit(args, legacy_to_dict(legacy), describe_legacy(legacy))
        return 0
    if args.num_layers is not None:
        raise CliInputError("--num-layers only applies to --legacy (v1 messages carry their own count)")
    msg = decode(parse_hex(args.message))
    emit(args, message_to_dict(msg), describe(msg))
    return 0
