"""Plain-words and JSON views of transition messages, for logs and ``elastic-pipe decode``.

Users of the published system had to ask its authors what its 50-float message meant; these functions spell
every field out.
"""

from __future__ import annotations

from typing import Any

from elastic_pipe.protocol.errors import CHECK
from elastic_pipe.protocol.legacy import LegacyMessage
from elastic_pipe.protocol.message import TransitionMessage

__all__ = ["describe", "describe_legacy", "legacy_to_dict", "message_to_dict"]


def _ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(str(r) for r in ranks) if ranks else "none"


def _norms(norms: tuple[float, ...] | None) -> str:
    if norms is None:
        return "none sent"
    if not norms:
        return "an empty list"
    return f"{len(norms)} values: " + ", ".join(f"{g:.6g}" for g in norms)


def message_to_dict(msg: TransitionMessage) -> dict[str, Any]:
    """The message's fields as a JSON-ready dict (tuples become lists, absent norms ``None``)."""
    CHECK.instance("msg", msg, TransitionMessage)
    return {
        "epoch": msg.epoch,
        "step": msg.step,
        "frozen": msg.frozen,
        "pipe_len": msg.pipe_len,
        "virtual": msg.virtual,
        "boundaries": list(msg.boundaries),
        "microbatches": msg.microbatches,
        "max_cost_at_start": msg.max_cost_at_start,
        "changed_ranks": list(msg.changed_ranks),
        "grad_norms": None if msg.grad_norms is None else list(msg.grad_norms),
    }


def legacy_to_dict(msg: LegacyMessage) -> dict[str, Any]:
    """The published message's fields as a JSON-ready dict, keyed as ``elastic-pipe decode --legacy --json``."""
    CHECK.instance("msg", msg, LegacyMessage)
    return {
        "num_frozen_layers": msg.num_frozen_layers,
        "pipe_len": msg.pipe_len,
        "max_params_per_gpu": msg.max_params_per_gpu,
        "epoch": msg.epoch,
        "new_ranks": list(msg.new_ranks),
        "grad_norms": None if msg.grad_norms is None else list(msg.grad_norms),
    }


def _layers(first: int, last: int) -> str:
    return f"layer {first}" if first == last else f"layers {first}-{last}"


def _table(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows) + 2
    return "\n".join([title, *(f"  {label + ':':<{width}}{value}" for label, value in rows)])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def describe(msg: TransitionMessage) -> str:
    """Every field of a transition message in plain words, one per line."""
    CHECK.instance("msg", msg, TransitionMessage)
    stages = "; ".join(
        f"stage {s}: {_layers(b, c - 1)}"
        for s, (b, c) in enumerate(zip(msg.boundaries, msg.boundaries[1:], strict=False))
    )
    frozen = f"{msg.frozen} ({_layers(0, msg.frozen - 1)} no longer train)" if msg.frozen else "0 (every layer trains)"
    return _table(
        "Transition message (elastic_pipe)",
        [
            ("takes effect at", f"epoch {msg.epoch}, step {msg.step}"),
            ("frozen layers", frozen),
            (
                "pipeline length",
                f"{msg.pipe_len} (each pipeline replica spans {_plural(msg.pipe_len, 'device')})",
            ),
            ("stages per device", f"{msg.virtual} ({_plural(msg.pipe_len * msg.virtual, 'stage')} in all)"),
            ("stage boundaries", f"{list(msg.boundaries)} ({stages})"),
            ("micro-batches", f"{msg.microbatches} per step and pipeline replica"),
            (
                "largest per-device cost at the start",
                f"{msg.max_cost_at_start:.6g} (the budget a compressed pipeline must stay under)",
            ),
            (
                "ranks whose role changes",
                f"{_ranks(msg.changed_ranks)} (newly active, or moved to another replica or stage)",
            ),
            ("gradient norms", _norms(msg.grad_norms)),
        ],
    )


def describe_legacy(msg: LegacyMessage) -> str:
    """Every field of the published 50-float message in plain words, one per line."""
    CHECK.instance("msg", msg, LegacyMessage)
    n = len(msg.new_ranks)
    if msg.grad_norms is None:
        norms_at = f"[{5 + n}]"
        norms = "none sent (the -1 marker)"
    else:
        norms_at = f"[{5 + n}:{5 + n + len(msg.grad_norms)}]"
        norms = _norms(msg.grad_norms)
    frozen = msg.num_frozen_layers
    return _table(
        "PipeTransformer frozen message (50 floats, as published)",
        [
            ("[0] frozen layers", f"{frozen} ({_layers(0, frozen - 1)} no longer train)" if frozen else "0"),
            ("[1] pipeline length", f"{msg.pipe_len} (each pipeline now spans {_plural(msg.pipe_len, 'GPU')})"),
            (
                "[2] largest per-GPU size at the start",
                f"{msg.max_params_per_gpu:.6g} million parameters (the budget a compressed pipeline must stay under)",
            ),
            ("[3] epoch", str(msg.epoch)),
            (
                "[4] newly added ranks",
                f"{n} (processes that start training a new pipeline replica with this transition)",
            ),
            (f"[5:{5 + n}] those ranks", _ranks(msg.new_ranks)),
            (f"{norms_at} gradient norms", norms),
            (f"[{5 + n + (1 if msg.grad_norms is None else len(msg.grad_norms))}:50] padding", "all 0.0"),
        ],
    )
