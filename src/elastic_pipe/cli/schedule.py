"""Generate, validate and simulate a pipeline schedule; print it, as JSON, or draw its Gantt chart.

P (``--stages``) is the number of pipeline ranks (devices). With ``--chunks V`` each rank holds V stages, P*V
stages in all, stage s on rank s mod P (the looped placement of torch's interleaved schedules).

``--costs`` gives per-micro-batch costs as a JSON object, inline or in a file: ``{"forward": 1.0, "backward":
2.0}``; every value is one number or one per stage; optional keys ``input_grad``, ``weight_grad`` (split
backward, default half of ``backward`` each), ``transfer`` (per hop) and ``overhead`` (host time per action).
Without ``--costs`` a forward costs 1 and a backward 2 time units.

Examples:

    elastic-pipe schedule --kind 1f1b --stages 4 --microbatches 8 --gantt 1f1b.png
    elastic-pipe schedule --kind interleaved --stages 4 --microbatches 8 --chunks 2 --json
    elastic-pipe schedule --kind zb1p --stages 4 --microbatches 8 --costs '{"forward": 1, "backward": 2}'
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, check_limit, emit, read_json_file

HELP = "Generate, validate and simulate a pipeline schedule (JSON, Gantt chart)."

_COST_KEYS = ("forward", "backward", "input_grad", "weight_grad", "transfer", "overhead")
_DEFAULT_COSTS: dict[str, Any] = {"forward": 1.0, "backward": 2.0}
#: Show at most this many actions per rank in the text output (the JSON always has all of them).
_TEXT_ACTIONS = 24

#: Upper bounds: generating, validating and simulating a schedule is pure Python at about 70k actions per second
#: (measured: 1F1B with 128 ranks and 1024 micro-batches, 262k actions, takes 4 s), so the limits keep a run
#: within seconds; real pipelines are far smaller (tens of ranks, hundreds of micro-batches).
MAX_RANKS = 1_024
MAX_MICROBATCHES = 16_384
MAX_CHUNKS = 64
#: At most three actions (forward, input and weight gradient) per stage and micro-batch: P x V x M x 3.
MAX_ACTIONS = 300_000
LIMIT_REASON = "schedules are simulated in pure Python at ~70k actions/s; larger ones would run for minutes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    from elastic_pipe.schedule import GENERATORS  # noqa: PLC0415 (the CLI imports subcommands lazily)

    # keep the module docstring's line breaks and examples in --help
    parser.formatter_class = argparse.RawDescriptionHelpFormatter

    parser.add_argument("--kind", required=True, choices=sorted(GENERATORS), help="schedule generator")
    parser.add_argument("--stages", type=int, required=True, metavar="P", help="pipeline ranks (devices)")
    parser.add_argument("--microbatches", type=int, required=True, metavar="M", help="micro-batches per step")
    parser.add_argument("--chunks", type=int, default=1, metavar="V", help="stages per rank (default 1)")
    parser.add_argument(
        "--costs", metavar="JSON|FILE", help='per-micro-batch costs, e.g. \'{"forward": 1, "backward": 2}\''
    )
    parser.add_argument("--gantt", metavar="FILE.png", help="also draw the simulated schedule (needs matplotlib)")
    add_json_flag(parser)


def _costs(spec: str | None) -> dict[str, Any]:
    if spec is None:
        return dict(_DEFAULT_COSTS)
    text = spec.strip()
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliInputError(f"--costs is not valid JSON: {exc.msg} at column {exc.colno}") from exc
    else:
        raw = read_json_file(text)
    if not isinstance(raw, dict):
        raise CliInputError(
            f"--costs must be a JSON object with keys {', '.join(_COST_KEYS)}, got {type(raw).__name__}"
        )
    unknown = sorted(set(raw) - set(_COST_KEYS))
    if unknown:
        raise CliInputError(f"--costs has unknown keys {unknown}: expected some of {', '.join(_COST_KEYS)}")
    costs = {**_DEFAULT_COSTS, **raw}
    for key, value in costs.items():
        ok = isinstance(value, int | float) or (
            isinstance(value, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        )
        if isinstance(value, bool) or not ok:
            raise CliInputError(f"--costs {key!r} must be a number or a list of numbers, got {value!r}")
    return costs


def _largest(costs: dict[str, Any]) -> float:
    values = [v for value in costs.values() for v in (value if isinstance(value, list) else [value])]
    return float(max(values, default=0.0))


def run(args: argparse.Namespace) -> int:
    """Generate, validate, simulate; print text or JSON; optionally draw the Gantt chart."""
    from elastic_pipe.schedule import gantt, generate, simulate, validate  # noqa: PLC0415 (see add_arguments)

    check_limit("--stages", args.stages, MAX_RANKS, LIMIT_REASON)
    check_limit("--microbatches", args.microbatches, MAX_MICROBATCHES, LIMIT_REASON)
    check_limit("--chunks", args.chunks, MAX_CHUNKS, LIMIT_REASON)
    if args.stages >= 1 and args.microbatches >= 1 and args.chunks >= 1:
        actions = args.stages * args.chunks * args.microbatches * 3
        check_limit("--stages x --chunks x --microbatches x 3 actions", actions, MAX_ACTIONS, LIMIT_REASON)
    costs = _costs(args.costs)
    schedule = generate(args.kind, args.stages, args.microbatches, args.chunks)
    validate(schedule)
    sim = simulate(
        schedule,
        costs["forward"],
        costs["backward"],
        input_grad=costs.get("input_grad"),
        weight_grad=costs.get("weight_grad"),
        transfer=costs.get("transfer", 0.0),
        overhead=costs.get("overhead", 0.0),
    )
    times = [sim.makespan, sim.bubble_fraction, *sim.busy, *sim.idle]
    if not all(math.isfinite(t) for t in times):
        raise CliInputError(
            f"--costs are too large: the simulated makespan is {sim.makespan!r}, beyond the float range "
            f"(largest cost {_largest(costs):g}); scale them down, e.g. to milliseconds"
        )
    chart = str(gantt(sim, args.gantt)) if args.gantt else None
    document: dict[str, Any] = {
        "kind": schedule.kind,
        "ranks": schedule.num_ranks,
        "stages": schedule.num_stages,
        "chunks": args.chunks,
        "microbatches": schedule.microbatches,
        "actions": schedule.to_text(),
        "makespan": sim.makespan,
        "bubble_fraction": sim.bubble_fraction,
        "busy": list(sim.busy),
        "idle": list(sim.idle),
        "peak_activations": list(sim.peak_activations),
        "costs": costs,
        "gantt": chart,
    }
    lines = [
        f"{schedule.kind}: {schedule.num_ranks} ranks, {schedule.num_stages} stages, {schedule.microbatches} "
        f"micro-batches (valid)",
        f"makespan {sim.makespan:.6g}  bubble {sim.bubble_fraction:.2%}  "
        f"peak activations per stage {list(sim.peak_activations)}",
    ]
    for rank, acts in schedule.to_text().items():
        shown = " ".join(acts[:_TEXT_ACTIONS]) + (
            f" ... (+{len(acts) - _TEXT_ACTIONS})" if len(acts) > _TEXT_ACTIONS else ""
        )
        lines.append(f"rank {rank}: {shown}")
    if chart:
        lines.append(f"Gantt chart: {chart}")
    emit(args, document, "\n".join(lines))
    return 0
