"""Find the smallest pipeline length that still fits after freezing.

FILE holds the ACTIVE layers (the frozen prefix has left the pipeline), in the formats of elastic-pipe partition:
a JSON list of numbers, or {"layers": [...]} records, --metric picking the field (default: params for the halving
rule, memory for the memory rule).

--rule halving (published): while K >= 2, partition over K/2 stages (with --solver, default greedy and its --unit);
if the largest stage is within --budget (M0, the largest stage at the start, in the file's unit), halve K, else
stop. --rule memory: the smallest K dividing --devices (default: --from) whose partition (--solver, default
optimal) keeps every stage within --budget (bytes; suffixes such as 16GiB are accepted).

Prints "pipe_len" and the partition; --json prints {"rule", "pipe_len", "partition": {...}, "tried": [...]}.
"""

from __future__ import annotations

import argparse
import math

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit
from elastic_pipe.cli.partition import describe_partition, load_costs
from elastic_pipe.types import LayerCost, parse_bytes

__all__ = ["HELP", "add_arguments", "run"]

HELP = "Find the smallest pipeline length that still fits after freezing (published halving or memory rule)."

_DEFAULT_SOLVER = {"halving": "greedy", "memory": "optimal"}
_DEFAULT_METRIC = {"halving": "params", "memory": "memory"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    # the partition package imports torch: only when this subcommand is named, never for `elastic-pipe --help`
    from elastic_pipe.partition import METRICS, PUBLISHED_UNIT  # noqa: PLC0415

    parser.add_argument("--costs", required=True, metavar="FILE", help="JSON costs of the active layers")
    parser.add_argument("--from", dest="from_stages", required=True, type=int, metavar="K", help="current length")
    parser.add_argument("--budget", required=True, metavar="B", help="largest stage allowed (e.g. 21.3e6, 16GiB)")
    parser.add_argument("--rule", choices=("halving", "memory"), default="halving", help="default: halving")
    parser.add_argument("--solver", default=None, metavar="NAME", help="default: greedy (halving), optimal (memory)")
    parser.add_argument("--devices", type=int, default=None, metavar="N", help="memory rule: device count (--from)")
    parser.add_argument("--metric", choices=METRICS, default=None, help="field of {'layers': [...]} records")
    parser.add_argument(
        "--unit", type=float, default=PUBLISHED_UNIT, metavar="U", help="greedy only: size unit (default 1e6)"
    )
    add_json_flag(parser)


def _budget(text: str) -> float:
    """``--budget``: a plain number in the file's unit (``21.3e6`` parameters, ``0.25`` seconds), or a byte size
    with a unit (``16GiB``, ``16G``: :func:`elastic_pipe.types.parse_bytes`, the grammar of every size)."""
    try:
        value = float(text)
    except ValueError:
        return float(parse_bytes(text))
    if not (math.isfinite(value) and value >= 0):
        raise CliInputError(f"--budget must be a finite number >= 0 or a byte size such as 16GiB, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Apply the compression rule and print the chosen pipeline length and partition."""
    from elastic_pipe.partition import (  # noqa: PLC0415 (see add_arguments)
        SOLVERS,
        compress_halving,
        compress_memory,
        weights_from_costs,
    )

    solver = args.solver or _DEFAULT_SOLVER[args.rule]
    if solver not in SOLVERS:
        raise CliInputError(f"unknown solver {solver!r}; valid solvers: {', '.join(sorted(SOLVERS))}")
    raw = load_costs(args.costs)
    records = [r for r in raw if isinstance(r, LayerCost)]
    metric = args.metric or _DEFAULT_METRIC[args.rule]
    values = weights_from_costs(records, metric) if records else [float(v) for v in raw if not isinstance(v, LayerCost)]
    budget = _budget(args.budget)
    options = {"unit": args.unit} if solver == "greedy" else {}
    if args.rule == "halving":
        result = compress_halving(values, args.from_stages, budget, solver, **options)
    else:
        devices = args.from_stages if args.devices is None else args.devices
        result = compress_memory(values, devices, budget, solver, **options)
    tried = ", ".join(f"K={k}: {b:.6g}" for k, b in result.tried) or "nothing (already 1)"
    text = f"pipe_len: {result.pipe_len} (rule {args.rule}, budget {budget:.6g}; tried {tried})\n" + describe_partition(
        result.partition
    )
    emit(args, result.to_dict(), text)
    return 0
