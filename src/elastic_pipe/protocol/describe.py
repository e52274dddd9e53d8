"""Plain-words and JSON views of transition messages, for logs and ``elastic-pipe decode``.

Users of the published system had to ask its authors what its 50-float message meant; these functions spell
every field out.
"""

from __future__ import annotations

from typing import Any

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
    return {
        "epoch": msg.epoch,
        "step": msg.step,
        "frozen": msg.frozen,
        "pipe_len": msg.pipe_len,
        "boundaries": list(msg.boundaries),
        "microbatches": msg.microbatches,
        "max_cost_at_start": msg.max_cost_at_start,
        "changed_ranks": list(msg.changed_ranks),
        "grad_norms": None if msg.grad_norms is None else list(msg.grad_norms),
    }


def legacy_to_dict(msg: LegacyMessage) -> dict[str, Any]:
    """The published message's fields as a JSON-ready dict, keyed as ``elastic-pipe decode --legacy --json``."""
    return {
        "num_frozen_layers": msg.num_frozen_layers,
        "pipe_len": msg.pipe_len,
        "max_params_per_gpu": msg.max_params_per_gpu,
        "epoch": msg.epoch,
        "new_ranks": list(msg.new_ranks),
        "grad_norms": None if msg.grad_norms is None else list(msg.grad_norms),
    }


def describe(msg: TransitionMessage) -> str:
    """Every field of a v1 message in plain words, one per line."""
    stages = "; ".join(
        f"stage {s}: layers {b}-{c - 1}"
        for s, (b, c) in enumerate(zip(msg.boundaries, msg.boundaries[1:], strict=False))
    )
    return "\n".join(
        (
            "Transition message (elastic_pipe v1)",
            f"  takes effect at:        epoch {msg.epoch}, step {msg.step}",
            f"  frozen layers:          {msg.frozen} (layers 0-{msg.frozen - 1} no longer train)"
            if msg.frozen
            else "  frozen layers:          0 (every layer trains)",
            f"  pipeline length:        {msg.pipe_len} (each pipeline replica is cut into {msg.pipe_len} "
            f"stage{'s' if msg.pipe_len != 1 else ''}, one device each)",
            f"  stage boundaries:       {list(msg.boundaries)} ({stages})",
            f"  micro-batches:          {msg.microbatches} per step and replica",
            f"  largest per-device cost at the start: {msg.max_cost_at_start:.6g} (the budget a compressed "
            "pipeline must stay under)",
            f"  ranks whose role changes: {_ranks(msg.changed_ranks)}",
            f"  gradient norms:         {_norms(msg.grad_norms)}",
        )
    )


def describe_legacy(msg: LegacyMessage) -> str:
    """Every field of the published 50-float message in plain words, one per line."""
    return "\n".join(
        (
            "PipeTransformer frozen message (50 floats, as published)",
            f"  [0] frozen layers:        {msg.num_frozen_layers} (the first {msg.num_frozen_layers} layers no "
            "longer train)",
            f"  [1] pipeline length:      {msg.pipe_len} (each pipeline now spans {msg.pipe_len} "
            f"GPU{'s' if msg.pipe_len != 1 else ''})",
            f"  [2] largest per-GPU size at the start: {msg.max_params_per_gpu:.6g} million parameters (the "
            "budget a compressed pipeline must stay under)",
            f"  [3] epoch:                {msg.epoch}",
            f"  [4] newly added ranks:    {len(msg.new_ranks)} (processes that start training a new pipeline "
            "replica with this transition)",
            f"  [5:{5 + len(msg.new_ranks)}] those ranks:       {_ranks(msg.new_ranks)}",
            f"  gradient norms:           {_norms(msg.grad_norms)}",
        )
    )
