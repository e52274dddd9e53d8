"""Partition per-layer costs into K contiguous pipeline stages.

FILE is JSON: either a list of numbers (one cost per layer, used as given; for the published greedy rule they
are parameter counts, divided by --unit, default 1e6, before the rule runs), or
{"layers": [{"name": ..., "params": ..., "forward": ..., "backward": ..., "activation_bytes": ...,
"memory_bytes": ..., "frozen_forward": ..., "frozen_memory_bytes": ...}, ...]} (any subset of the fields;
--metric picks which one is partitioned). The first --frozen layers are frozen: greedy applies the published
rule (all on stage 0, priced by --frozen-factor); every other solver prices them by their measured frozen cost
(records) or by --frozen-factor. graph treats the layers as a chain whose cuts cost activation_bytes /
--bandwidth on both sides.

--json prints {"solver", "layers_per_stage", "boundaries", "stage_costs" (in the input's unit), "bottleneck",
"solve_seconds" (the solver alone), ...}.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit, read_json_file
from elastic_pipe.types import LayerCost

if TYPE_CHECKING:
    from elastic_pipe.partition import Partition

__all__ = ["HELP", "add_arguments", "describe_partition", "load_costs", "run"]

HELP = "Partition layer costs into K contiguous pipeline stages (uniform, greedy, optimal, graph)."

_RECORD_FIELDS = set(LayerCost.__dataclass_fields__)


def load_costs(path: str) -> list[float] | list[LayerCost]:
    """Read a costs file: a JSON list of numbers, or ``{"layers": [record, ...]}``.

    Raises:
        CliInputError: when the file is unreadable, not JSON, or not one of the two shapes.
    """
    data = read_json_file(path)
    if isinstance(data, list):
        for index, item in enumerate(data):
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise CliInputError(f"{path}: item {index} is {item!r}, expected a number")
        return [float(v) for v in data]
    if isinstance(data, dict) and isinstance(data.get("layers"), list):
        records: list[LayerCost] = []
        for index, item in enumerate(data["layers"]):
            if not isinstance(item, dict):
                raise CliInputError(f"{path}: layers[{index}] is {item!r}, expected an object")
            unknown = set(item) - _RECORD_FIELDS
            if unknown:
                raise CliInputError(
                    f"{path}: layers[{index}] has unknown keys {sorted(unknown)}; known: {sorted(_RECORD_FIELDS)}"
                )
            fields: dict[str, Any] = {"name": f"layer{index}", **item}
            for key, value in fields.items():
                if (
                    key != "name"
                    and value is not None
                    and (isinstance(value, bool) or not isinstance(value, (int, float)))
                ):
                    raise CliInputError(f"{path}: layers[{index}].{key} is {value!r}, expected a number")
            try:
                records.append(LayerCost(**fields))
            except TypeError as exc:
                raise CliInputError(f"{path}: layers[{index}]: {exc}") from None
        return records
    raise CliInputError(f'{path}: expected a JSON list of numbers or {{"layers": [...]}}, got {type(data).__name__}')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    # the partition package imports torch: only when this subcommand is named, never for `elastic-pipe --help`
    from elastic_pipe.partition import DEFAULT_FROZEN_FACTOR, METRICS, PUBLISHED_UNIT, SOLVERS  # noqa: PLC0415

    parser.add_argument("--costs", required=True, metavar="FILE", help="JSON costs file (see above)")
    parser.add_argument("--stages", required=True, type=int, metavar="K", help="number of pipeline stages")
    parser.add_argument(
        "--solver",
        default="optimal",
        metavar="NAME",
        help=f"one of: {', '.join(sorted(SOLVERS))} (default: optimal)",
    )
    parser.add_argument("--frozen", type=int, default=0, metavar="F", help="number of frozen leading layers")
    parser.add_argument(
        "--frozen-factor",
        type=float,
        default=DEFAULT_FROZEN_FACTOR,
        metavar="X",
        help="a frozen layer's cost relative to an active one (default 1/6, as published)",
    )
    parser.add_argument(
        "--unit",
        type=float,
        default=PUBLISHED_UNIT,
        metavar="U",
        help="greedy only: sizes are divided by U before the published rule (default 1e6: millions of params)",
    )
    parser.add_argument(
        "--metric",
        choices=METRICS,
        default="params",
        help='for {"layers": [...]} files: which cost to partition (default: params)',
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=math.inf,
        metavar="BYTES_PER_S",
        help="graph only: link bandwidth pricing activation_bytes at each cut (default: inf, free)",
    )
    parser.add_argument(
        "--allow-empty", action="store_true", help="greedy only: return the published output even with empty stages"
    )
    add_json_flag(parser)


def _weights(raw: list[float] | list[LayerCost], metric: str, frozen: int, factor: float) -> list[float]:
    """Per-layer weights with the first ``frozen`` priced (measured frozen cost, else ``factor``)."""
    from elastic_pipe.partition import price_frozen, weights_from_costs  # noqa: PLC0415 (see add_arguments)

    records = [r for r in raw if isinstance(r, LayerCost)]
    if records:
        return weights_from_costs(records, metric, frozen, factor)
    return price_frozen([float(v) for v in raw if not isinstance(v, LayerCost)], frozen, factor)


def partition_from_args(args: argparse.Namespace, raw: list[float] | list[LayerCost]) -> Partition:
    """Run the solver the options name on the loaded costs."""
    from elastic_pipe.partition import solve  # noqa: PLC0415 (see add_arguments)

    if args.solver == "greedy":
        # The published rule prices the frozen prefix itself (all of it on stage 0).
        return solve(
            _weights(raw, args.metric, 0, 1.0),
            args.stages,
            "greedy",
            frozen=args.frozen,
            frozen_factor=args.frozen_factor,
            unit=args.unit,
            allow_empty=args.allow_empty,
        )
    weights = _weights(raw, args.metric, args.frozen, args.frozen_factor)
    if args.solver == "graph":
        sizes = [float(r.activation_bytes) if isinstance(r, LayerCost) else 0.0 for r in raw]
        return solve(weights, args.stages, "graph", activation_bytes=sizes, bandwidth=args.bandwidth)
    return solve(weights, args.stages, args.solver)


def describe_partition(partition: Partition, names: list[str] | None = None) -> str:
    """A human-readable table of a partition."""
    lines = [
        f"solver {partition.solver}: {partition.num_layers} layers on {partition.num_stages} stages, "
        f"bottleneck {partition.bottleneck:.6g}, solved in {partition.solve_seconds * 1e3:.3f} ms",
        f"{'stage':>5}  {'layers':>13}  {'count':>5}  {'cost':>12}",
    ]
    bounds = partition.boundaries
    for stage, (count, cost) in enumerate(zip(partition.layers_per_stage, partition.stage_costs, strict=True)):
        span = f"{bounds[stage]}..{bounds[stage + 1] - 1}" if count else "-"
        if names and count:
            span = f"{names[bounds[stage]]}..{names[bounds[stage + 1] - 1]}"
        lines.append(f"{stage:>5}  {span:>13}  {count:>5}  {cost:>12.6g}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Partition the costs file and print the result."""
    raw = load_costs(args.costs)
    partition = partition_from_args(args, raw)
    document = {
        **partition.to_dict(),
        "stages": args.stages,
        "num_layers": partition.num_layers,
        "frozen": args.frozen,
    }
    emit(args, document, describe_partition(partition))
    return 0
