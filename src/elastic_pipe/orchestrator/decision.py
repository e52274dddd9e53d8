"""Rank 0's side of a decision point: from freeze counts and sub-layer costs to the next :class:`Layout`.

Composition only: the partition comes from :func:`elastic_pipe.partition.solve`, the shorter pipeline from
:func:`elastic_pipe.partition.compress_halving` or :func:`elastic_pipe.partition.compress_memory`, the message
format from :mod:`elastic_pipe.protocol`. The functions here are pure (no process group), so every decision can be
unit-tested and replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from elastic_pipe import partition as part
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.protocol import TransitionMessage, decode, encode
from elastic_pipe.types import ElasticPipeError, Layout

__all__ = [
    "ERROR_PREFIX",
    "announce",
    "initial_layout",
    "layout_from_message",
    "max_frozen_units",
    "message_for",
    "next_layout",
]

#: Marks a control-group payload that carries rank 0's error instead of a message.
ERROR_PREFIX = b"ELASTIC_PIPE_ERROR "


def initial_layout(
    costs: Sequence[float], pipe_len: int, world_size: int, *, solver: str, microbatches: int
) -> tuple[Layout, float]:
    """The layout at the start (nothing frozen) and its bottleneck cost, the budget compression must respect."""
    p = part.solve(list(costs), pipe_len, solver)
    layout = Layout(0, pipe_len, world_size // pipe_len, tuple(p.boundaries), microbatches)
    return layout, float(p.bottleneck)


def max_frozen_units(unit_ends: Sequence[int], num_sublayers: int, min_active: int) -> int:
    """The most units that may freeze while at least ``min_active`` sub-layers stay active.

    Without compression the pipeline keeps its length, so it needs one active sub-layer per stage.
    """
    best = 0
    for units, end in enumerate(unit_ends, start=1):
        if num_sublayers - end >= min_active:
            best = units
    return best


def next_layout(
    current: Layout,
    frozen: int,
    costs: Sequence[float],
    *,
    compression: str,
    solver: str,
    budget: float,
    world_size: int,
    microbatches_for: Callable[[int], int] | None = None,
) -> Layout:
    """The layout once the first ``frozen`` sub-layers are frozen.

    Args:
        current: the layout now.
        frozen: frozen sub-layers after the decision (``>= current.frozen``).
        costs: per-sub-layer cost (the same metric as ``budget``).
        compression: "halving" (the published rule), "memory" or "none" (re-partition at the same length).
        solver: partition solver name.
        budget: the largest per-stage cost allowed after compression (the bottleneck at the start).
        world_size: number of ranks (the new pipeline length must divide it).
        microbatches_for: micro-batch count for a pipeline length (default: keep the current count).

    Raises:
        OrchestratorError: if the compressed length does not divide the world size.
    """
    if frozen == current.frozen:
        return current
    active = list(costs[frozen:])
    if compression == "none":
        pipe_len = current.pipe_len
        p = part.solve(active, pipe_len, solver)
    elif compression == "halving":
        c = part.compress_halving(active, current.pipe_len, budget, solver=solver)
        pipe_len, p = c.pipe_len, c.partition
    else:
        c = part.compress_memory(active, current.pipe_len, budget, solver=solver)
        pipe_len, p = c.pipe_len, c.partition
    if world_size % pipe_len:
        raise OrchestratorError(
            f"compression chose pipe_len={pipe_len}, which does not divide the world size {world_size}"
        )
    boundaries = tuple(frozen + b for b in p.boundaries)
    microbatches = current.microbatches if microbatches_for is None else microbatches_for(pipe_len)
    return Layout(frozen, pipe_len, world_size // pipe_len, boundaries, microbatches)


def message_for(
    layout: Layout, *, epoch: int, step: int, budget: float, changed: Sequence[int], grad_norms: Sequence[float] | None
) -> TransitionMessage:
    """The :class:`TransitionMessage` announcing ``layout``."""
    return TransitionMessage(
        epoch=epoch,
        step=step,
        frozen=layout.frozen,
        pipe_len=layout.pipe_len,
        boundaries=tuple(layout.boundaries),
        microbatches=layout.microbatches,
        max_cost_at_start=float(budget),
        changed_ranks=tuple(changed),
        grad_norms=None if grad_norms is None else tuple(float(g) for g in grad_norms),
    )


def layout_from_message(msg: TransitionMessage, world_size: int) -> Layout:
    """The layout a decoded message announces.

    Raises:
        OrchestratorError: if the pipeline length does not divide the world size.
    """
    if world_size % msg.pipe_len:
        raise OrchestratorError(f"message pipe_len={msg.pipe_len} does not divide the world size {world_size}")
    return Layout(msg.frozen, msg.pipe_len, world_size // msg.pipe_len, tuple(msg.boundaries), msg.microbatches)


def announce(
    make: Callable[[], TransitionMessage], *, rank: int, broadcast_bytes: Callable[[bytes | None, int], bytes]
) -> TransitionMessage:
    """Rank 0 runs ``make`` and broadcasts the encoded message; every rank returns the decoded message.

    If rank 0's decision fails, the error travels instead of a message, so every rank stops with the same
    one-line reason at once rather than waiting in a broadcast until the timeout.

    Args:
        make: builds the message (called on rank 0 only).
        rank: this rank.
        broadcast_bytes: ``broadcast_bytes(payload_or_None, src) -> payload`` over the control group.

    Raises:
        OrchestratorError: on every rank, when ``make`` raised an :class:`~elastic_pipe.types.ElasticPipeError`.
    """
    payload = None
    if rank == 0:
        try:
            payload = encode(make())
        except ElasticPipeError as exc:
            payload = ERROR_PREFIX + " ".join(str(exc).split()).encode()
    data = broadcast_bytes(payload, 0)
    if data.startswith(ERROR_PREFIX):
        raise OrchestratorError(f"rank 0 could not decide: {data[len(ERROR_PREFIX) :].decode()}")
    return decode(data)
