"""A decision travels as a message: a :class:`Layout` to and from a :class:`TransitionMessage`, and rank 0's
broadcast of it on the control group (its error travels instead when it could not decide).

The layout itself comes from :mod:`elastic_pipe.orchestrator.layout.rule`; the format from
:mod:`elastic_pipe.protocol`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.protocol import AbortMessage, TransitionMessage, decode_any, encode
from elastic_pipe.types import ElasticPipeError, Layout

__all__ = ["announce", "layout_from_message", "message_for"]


def message_for(layout: Layout, *, epoch: int, step: int, budget: float, changed: Sequence[int]) -> TransitionMessage:
    """The :class:`TransitionMessage` announcing ``layout``.

    It carries what its receivers read: the layout, the position, the budget (read once, at the start) and the
    changed ranks (the transition event). The optional per-layer gradient norms of the published message are left
    out: no rank reads them (rank 0, which decides, has them already).
    """
    return TransitionMessage(
        epoch=epoch,
        step=step,
        frozen=layout.frozen,
        pipe_len=layout.pipe_len,
        boundaries=tuple(layout.boundaries),
        microbatches=layout.microbatches,
        virtual=layout.virtual,
        max_cost_at_start=float(budget),
        changed_ranks=tuple(changed),
    )


def layout_from_message(msg: TransitionMessage, world_size: int) -> Layout:
    """The layout a decoded message announces.

    Raises:
        OrchestratorError: if the pipeline length does not divide the world size.
    """
    if world_size % msg.pipe_len:
        raise OrchestratorError(f"message pipe_len={msg.pipe_len} does not divide the world size {world_size}")
    return Layout(
        msg.frozen, msg.pipe_len, world_size // msg.pipe_len, tuple(msg.boundaries), msg.microbatches, msg.virtual
    )


def announce(
    make: Callable[[], TransitionMessage], *, rank: int, broadcast_bytes: Callable[[bytes | None, int], bytes]
) -> TransitionMessage:
    """Rank 0 runs ``make`` and broadcasts the encoded message; every rank returns the decoded message.

    If rank 0's decision fails, an :class:`~elastic_pipe.protocol.AbortMessage` travels instead, so every rank
    stops with the same one-line reason at once rather than waiting in a broadcast until the timeout.

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
            payload = encode(AbortMessage.from_text(rank, str(exc)))
    message = decode_any(broadcast_bytes(payload, 0))
    if isinstance(message, AbortMessage):
        raise OrchestratorError(f"rank {message.rank} could not decide: {message.reason}")
    if not isinstance(message, TransitionMessage):
        raise OrchestratorError(f"rank 0 sent a {type(message).__name__} where a transition message was due")
    return message
