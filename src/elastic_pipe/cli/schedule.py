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
from typing import Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, emit, read_json_file

HELP = "Generate, validate and simulate a pipeline schedule (JSON, Gantt chart)."

_COST_KEYS = ("forward", "backward", "input_grad", "weight_grad", "transfer", "overhead")
_DEFAULT_COSTS: dict[str, Any] = {"forward": 1.0, "backward": 2.0}
#: Show at most this many actions per rank in the text output (the JSON always has all of them).
_TEXT_ACTIONS = 24


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


def run(args: argparse.Namespace) -> int:
    """Generate, validate, simulate; print text or JSON; optionally draw the Gantt chart."""
    from elastic_pipe.schedule import gantt, generate, simulate, validate  # noqa: PLC0415 (see add_arguments)

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
