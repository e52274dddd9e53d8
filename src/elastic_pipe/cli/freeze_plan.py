"""Print the frozen-layer count per epoch of a schedule-driven freeze policy (a dry run: nothing trains).

Examples::

    elastic-pipe freeze-plan --policy alpha --alpha 1/3 --layers 12 --epochs 10
    elastic-pipe freeze-plan --policy freezeout --t0 0.5 --layers 12 --epochs 10 --json
    elastic-pipe freeze-plan --policy manual --schedule 2:4,5:8 --layers 12 --epochs 8

The JSON document holds ``frozen_by_epoch``: the count at the start of each epoch 0 .. E-1.
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from typing import Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, check_limit, emit

HELP = "Print the frozen-layer count per epoch of a schedule-driven freeze policy."

#: Policies that decide from the epoch or step alone, so a plan exists before training.
SCHEDULE_POLICIES = ("alpha", "freezeout", "manual", "never")
#: Widest timeline bar in characters; larger models are drawn to scale.
_BAR_WIDTH = 60

#: Upper bounds: the layers and epochs are the policies' and the plan's own (``freeze.policy.MAX_LAYERS``,
#: ``freeze.plan.MAX_EPOCHS``). The plan has one row per epoch and the freezeout policy looks at every layer each
#: epoch (about 2.5M layer-epochs per second, measured), so layers x epochs bounds the time too; the limits sit far
#: beyond real models (tens to thousands of freezable layers) and schedules (hundreds of epochs).
MAX_LAYER_EPOCHS = 5_000_000
MAX_STEPS_PER_EPOCH = 10**9
LIMIT_REASON = "a plan with more rows or layers than this takes minutes and is too large to read"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument("--policy", default="alpha", help=f"one of {', '.join(SCHEDULE_POLICIES)} (default alpha)")
    parser.add_argument("--layers", type=int, required=True, help="number of freezable layers L")
    parser.add_argument("--epochs", type=int, required=True, help="number of epochs E")
    parser.add_argument(
        "--alpha", help="alpha policy: fraction of the active layers frozen per epoch, e.g. 0.3333 or 1/3"
    )
    parser.add_argument("--t0", type=float, help="freezeout policy: fraction of the run after which layer 0 stops")
    parser.add_argument("--cubic", action="store_true", help="freezeout policy: cube the stop fractions")
    parser.add_argument(
        "--steps-per-epoch", type=int, default=1, help="freezeout policy: optimizer steps per epoch (default 1)"
    )
    parser.add_argument("--schedule", help="manual policy: EPOCH:FROZEN pairs, e.g. 2:4,5:8")
    add_json_flag(parser)


def _parse_alpha(text: str) -> float:
    try:
        value = float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise CliInputError(f"--alpha {text!r} is not a number or a fraction like 1/3") from None
    return value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    from elastic_pipe.freeze import POLICIES, FreezeError, parse_manual  # noqa: PLC0415 (freeze imports torch)

    def need(flag: str, value: object) -> None:
        if value is None:
            raise CliInputError(f"--policy {args.policy} needs {flag}")

    if args.policy == "alpha":
        need("--alpha", args.alpha)
        return {"alpha": _parse_alpha(args.alpha)}
    if args.policy == "freezeout":
        need("--t0", args.t0)
        if args.epochs < 1 or args.steps_per_epoch < 1:
            raise CliInputError(
                f"--epochs and --steps-per-epoch must be >= 1, got {args.epochs} and {args.steps_per_epoch}"
            )
        return {"t0": args.t0, "total_steps": args.epochs * args.steps_per_epoch, "cubic": args.cubic}
    if args.policy == "manual":
        need("--schedule", args.schedule)
        return {"schedule": parse_manual(args.schedule)}
    if args.policy == "never":
        return {}
    if args.policy in POLICIES:
        reason = (
            "decides from signals measured in training (gradient statistics or probe drift), so it has no plan "
            "without training"
        )
    else:
        reason = "is not a known freeze policy"
    raise FreezeError(f"--policy {args.policy!r} {reason}; expected one of {', '.join(SCHEDULE_POLICIES)}")


def timeline(frozen: tuple[int, ...] | list[int], num_layers: int) -> str:
    """Draw one row per epoch: ``#`` for frozen layers, ``.`` for active ones (scaled past 60 layers)."""
    width = min(num_layers, _BAR_WIDTH)
    rows = ["epoch  frozen  layers (# frozen, . active)"]
    for epoch, count in enumerate(frozen):
        marks = math.floor(count * width / num_layers)
        rows.append(f"{epoch:>5}  {count:>6}  {'#' * marks}{'.' * (width - marks)}")
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    """Build the policy, dry-run it for ``--epochs`` epochs and print the plan."""
    from elastic_pipe.freeze import frozen_by_epoch, make_policy  # noqa: PLC0415 (see _options)
    from elastic_pipe.freeze.plan import MAX_EPOCHS  # noqa: PLC0415 (likewise)
    from elastic_pipe.freeze.policy import MAX_LAYERS  # noqa: PLC0415 (likewise)

    check_limit("--layers", args.layers, MAX_LAYERS, LIMIT_REASON)
    check_limit("--epochs", args.epochs, MAX_EPOCHS, LIMIT_REASON)
    check_limit("--steps-per-epoch", args.steps_per_epoch, MAX_STEPS_PER_EPOCH, LIMIT_REASON)
    if args.layers > 0 and args.epochs > 0:
        check_limit("--layers x --epochs", args.layers * args.epochs, MAX_LAYER_EPOCHS, LIMIT_REASON)
    options = _options(args)
    policy = make_policy(args.policy, args.layers, **options)
    frozen = frozen_by_epoch(policy, args.epochs, args.steps_per_epoch)
    shown = {k: (sorted(v.items()) if isinstance(v, dict) else v) for k, v in options.items()}
    document = {
        "policy": args.policy,
        "num_layers": args.layers,
        "epochs": args.epochs,
        "options": {k: ([list(p) for p in v] if isinstance(v, list) else v) for k, v in shown.items()},
        "frozen_by_epoch": list(frozen),
    }
    described = ", ".join(f"{k}={v}" for k, v in shown.items())
    header = f"freeze plan: {args.policy}{f' ({described})' if described else ''}, {args.layers} layers, "
    header += f"{args.epochs} epochs"
    emit(args, document, f"{header}\n{timeline(frozen, args.layers)}")
    return 0
