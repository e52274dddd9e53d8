"""The transition message: what every rank must agree on when the job changes shape.

Rank 0 decides a transition (more layers frozen, a shorter pipeline, new replicas) and tells every other rank
with one :class:`TransitionMessage`. The dataclass validates itself, so a message that decodes is also a message
that makes sense: boundaries that fit the pipeline length, counts that are not negative, costs that are finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic_pipe.protocol.errors import ProtocolError, ProtocolTypeError

__all__ = ["MAX_GRAD_NORMS", "MAX_PIPE_LEN", "MAX_RANKS", "TransitionMessage"]

#: Largest pipeline length a message may carry, and the most stages (``pipe_len * virtual``). Far beyond any real
#: pipeline; it bounds what a decoder allocates.
MAX_PIPE_LEN = 1 << 16
#: Largest number of changed ranks a message may list (a million-device job is already out of reach).
MAX_RANKS = 1 << 20
#: Largest number of per-layer gradient norms a message may carry.
MAX_GRAD_NORMS = 1 << 20
#: Integer fields are stored as unsigned 64-bit values in the v1 codec; ranks and layer counts as 32-bit ones.
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1


def _check_int(name: str, value: object, low: int, high: int) -> None:
    # bool is an int subclass; True as a layer count is almost certainly a bug in the caller.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolTypeError(f"TransitionMessage.{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ProtocolError(f"TransitionMessage.{name} must be in [{low}, {high}], got {value}")


def _check_float(name: str, value: object) -> None:
    if not isinstance(value, float | int) or isinstance(value, bool):
        raise ProtocolTypeError(f"TransitionMessage.{name} must be a float, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ProtocolError(f"TransitionMessage.{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class TransitionMessage:
    """One transition, as rank 0 announces it to every rank.

    Attributes:
        epoch: epoch at which the transition takes effect.
        step: global optimizer step at which it takes effect.
        frozen: number of frozen leading layers after the transition.
        pipe_len: new pipeline length K (ranks per pipeline replica).
        boundaries: ``pipe_len * virtual + 1`` layer indices; stage ``s`` holds layers
            ``boundaries[s]:boundaries[s+1]``. They start at ``frozen`` (the frozen prefix is not part of the
            pipeline) and strictly increase.
        microbatches: micro-batches per step and replica for the new pipeline length.
        max_cost_at_start: the largest per-device cost of the partition at the start of training (the budget
            that compression must respect; parameters, bytes or seconds, as the planner chose).
        changed_ranks: ranks whose role changes (newly activated, or moved to another replica or stage),
            distinct, in increasing order.
        grad_norms: optional per-layer gradient norms (finite, >= 0) that the freeze decision was based on.
        virtual: stages per rank v (``pipe_len * virtual <= MAX_PIPE_LEN``); 1 for a version 1 message, which
            did not carry it.

    Raises:
        ProtocolError: on any field that does not fit the description above.
    """

    epoch: int
    step: int
    frozen: int
    pipe_len: int
    boundaries: tuple[int, ...]
    microbatches: int
    max_cost_at_start: float
    changed_ranks: tuple[int, ...]
    grad_norms: tuple[float, ...] | None = None
    virtual: int = 1

    def __post_init__(self) -> None:
        _check_int("epoch", self.epoch, 0, _U64_MAX)
        _check_int("step", self.step, 0, _U64_MAX)
        _check_int("frozen", self.frozen, 0, _U32_MAX)
        _check_int("pipe_len", self.pipe_len, 1, MAX_PIPE_LEN)
        _check_int("microbatches", self.microbatches, 1, _U32_MAX)
        _check_float("max_cost_at_start", self.max_cost_at_start)
        _check_int("virtual", self.virtual, 1, MAX_PIPE_LEN // self.pipe_len)
        stages = self.pipe_len * self.virtual
        if not isinstance(self.boundaries, tuple) or len(self.boundaries) != stages + 1:
            raise (ProtocolError if isinstance(self.boundaries, tuple) else ProtocolTypeError)(
                f"TransitionMessage.boundaries must be a tuple of pipe_len * virtual + 1 = {stages + 1} layer "
                f"indices, got {self.boundaries!r}"
            )
        for b in self.boundaries:
            _check_int("boundaries[...]", b, 0, _U32_MAX)
        if self.boundaries[0] != self.frozen:
            raise ProtocolError(
                f"TransitionMessage.boundaries must start at frozen={self.frozen}, got {self.boundaries[0]}"
            )
        if any(b >= c for b, c in zip(self.boundaries, self.boundaries[1:], strict=False)):
            raise ProtocolError(
                f"TransitionMessage.boundaries must strictly increase (no empty stage), got {self.boundaries!r}"
            )
        if not isinstance(self.changed_ranks, tuple) or len(self.changed_ranks) > MAX_RANKS:
            raise (ProtocolError if isinstance(self.changed_ranks, tuple) else ProtocolTypeError)(
                f"TransitionMessage.changed_ranks must be a tuple of at most {MAX_RANKS} ranks, "
                f"got {type(self.changed_ranks).__name__}"
                + (f" of length {len(self.changed_ranks)}" if isinstance(self.changed_ranks, tuple) else "")
            )
        for r in self.changed_ranks:
            _check_int("changed_ranks[...]", r, 0, _U32_MAX)
        if any(a >= b for a, b in zip(self.changed_ranks, self.changed_ranks[1:], strict=False)):
            raise ProtocolError(
                f"TransitionMessage.changed_ranks must be distinct and increasing, got {self.changed_ranks!r}"
            )
        if self.grad_norms is not None:
            if not isinstance(self.grad_norms, tuple) or len(self.grad_norms) > MAX_GRAD_NORMS:
                raise (ProtocolError if isinstance(self.grad_norms, tuple) else ProtocolTypeError)(
                    f"TransitionMessage.grad_norms must be None or a tuple of at most {MAX_GRAD_NORMS} floats, "
                    f"got {type(self.grad_norms).__name__}"
                )
            for g in self.grad_norms:
                _check_float("grad_norms[...]", g)

    @property
    def active_layers(self) -> int:
        """Number of layers the pipeline still trains (``boundaries[-1] - frozen``)."""
        return self.boundaries[-1] - self.frozen

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Number of active layers on each stage."""
        return tuple(c - b for b, c in zip(self.boundaries, self.boundaries[1:], strict=False))
