"""The schedule IR: compute actions per (stage, micro-batch) and per-rank ordered action lists.

The text form is torch.distributed.pipelining's: ``"<stage><kind><microbatch>"``, e.g. ``2F0`` (stage 2 runs the
forward of micro-batch 0), ``1B3`` (full backward), ``0I1`` / ``0W1`` (input-gradient / weight-gradient halves of
a backward, as split by zero-bubble schedules). A :class:`Schedule` maps each rank to its ordered compute actions;
communication is implied by the data dependencies between consecutive stages and is not part of the IR.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from elastic_pipe._checks import INT64_MAX
from elastic_pipe.schedule.errors import CHECK, ScheduleError
from elastic_pipe.types import stage_ranks

__all__ = ["MAX_CHUNKS", "MAX_MICROBATCHES", "MAX_RANKS", "Action", "ActionKind", "Schedule"]

_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")

#: Bounds on a schedule's shape, far beyond real pipelines (tens of ranks, hundreds of micro-batches, a few stages
#: per rank): a schedule is a list of ``ranks * chunks * microbatches`` actions per kind, generated and played in
#: pure Python, so larger ones would take minutes or exhaust memory.
MAX_RANKS = 1_024
MAX_MICROBATCHES = 16_384
MAX_CHUNKS = 64


class ActionKind(StrEnum):
    """What a compute action does to one micro-batch on one stage."""

    F = "F"  #: forward
    B = "B"  #: full backward (input and weight gradients together)
    I = "I"  #: backward for the input gradient only (what the previous stage waits for)  # noqa: E741
    W = "W"  #: backward for the weight gradient only (nobody waits for it; zero-bubble schedules delay it)


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One compute action: ``kind`` on ``stage`` for ``microbatch``.

    ``str(Action(2, ActionKind.F, 0)) == "2F0"`` and ``Action.parse("2F0")`` is its inverse.
    """

    stage: int
    kind: ActionKind
    microbatch: int

    def __post_init__(self) -> None:
        if type(self.stage) is not int or type(self.microbatch) is not int:  # one cheap test on the common path
            CHECK.int("Action stage", self.stage)
            CHECK.int("Action microbatch", self.microbatch)
        if self.stage < 0 or self.microbatch < 0 or max(self.stage, self.microbatch) > INT64_MAX:
            raise ScheduleError(f"Action needs stage >= 0 and microbatch >= 0, got {self.stage}, {self.microbatch}")
        # accept the plain letter ("F") too, as torch's text form and JSON carry it
        object.__setattr__(self, "kind", _kind(self.kind))

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse torch's text form, e.g. ``"2F0"``, ``"1B3"``, ``"0W1"``.

        Raises:
            ScheduleError: ``text`` is not ``<stage><F|B|I|W><microbatch>``.
        """
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise ScheduleError(f"cannot parse action {text!r}: expected <stage><F|B|I|W><microbatch>, e.g. '2F0'")
        return cls(int(match[1]), ActionKind(match[2]), int(match[3]))


def _kind(value: str) -> ActionKind:
    if type(value) is not ActionKind:  # the common case costs one test
        CHECK.str("Action kind", value)
    try:
        return ActionKind(value)
    except ValueError:
        raise ScheduleError(f"unknown action kind {value!r}: expected one of F, B, I, W") from None


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: each rank's ordered compute actions.

    Attributes:
        kind: the generator that made it (free text for hand-written schedules).
        num_ranks: pipeline ranks (devices).
        num_stages: pipeline stages; a rank may hold several (interleaved placements).
        microbatches: micro-batches per step.
        actions: rank -> ordered compute actions of that rank (every rank in ``range(num_ranks)``).
        placement: stage -> rank; empty means the looped placement of torch's interleaved schedules,
            stage ``s`` on rank ``s % num_ranks`` (:func:`elastic_pipe.types.stage_ranks` states the rule, and
            :attr:`elastic_pipe.types.Placement.ranks` of a layout is a valid value here).
    """

    kind: str
    num_ranks: int
    num_stages: int
    microbatches: int
    actions: dict[int, tuple[Action, ...]]
    placement: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        CHECK.str("Schedule kind", self.kind)
        CHECK.int("Schedule num_ranks", self.num_ranks, hi=MAX_RANKS)
        CHECK.int("Schedule num_stages", self.num_stages, hi=MAX_RANKS * MAX_CHUNKS)
        CHECK.int("Schedule microbatches", self.microbatches, hi=MAX_MICROBATCHES)
        CHECK.mapping("Schedule actions", self.actions)
        CHECK.ints("Schedule placement", self.placement, empty=True)
        if self.num_ranks < 1 or self.num_stages < 1 or self.microbatches < 1:
            raise ScheduleError(
                "Schedule needs num_ranks, num_stages and microbatches >= 1, got "
                f"{self.num_ranks}, {self.num_stages}, {self.microbatches}"
            )
        if self.num_stages < self.num_ranks:
            raise ScheduleError(
                f"Schedule has {self.num_stages} stages for {self.num_ranks} ranks: every rank needs a stage"
            )
        per_rank = -(-self.num_stages // self.num_ranks)
        placement = self.placement or stage_ranks(self.num_ranks, per_rank, "loop")[: self.num_stages]
        if len(placement) != self.num_stages or any(not 0 <= r < self.num_ranks for r in placement):
            raise ScheduleError(
                f"Schedule.placement must map each of {self.num_stages} stages to a rank in "
                f"[0, {self.num_ranks}), got {self.placement!r}"
            )
        object.__setattr__(self, "placement", placement)
        if sorted(self.actions) != list(range(self.num_ranks)):
            raise ScheduleError(
                f"Schedule.actions must have exactly the ranks 0..{self.num_ranks - 1}, got {sorted(self.actions)}"
            )
        object.__setattr__(self, "actions", {r: tuple(self.actions[r]) for r in range(self.num_ranks)})

    def stage_to_rank(self, stage: int) -> int:
        """The rank that holds ``stage``."""
        if not 0 <= stage < self.num_stages:
            raise ScheduleError(f"stage {stage} out of range [0, {self.num_stages})")
        return self.placement[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages that ``rank`` holds, in increasing order."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    @property
    def num_actions(self) -> int:
        """Compute actions over all ranks."""
        return sum(len(a) for a in self.actions.values())

    def to_text(self) -> dict[str, list[str]]:
        """Rank (as a string) -> action strings in torch's text form (the CLI's and golden files' format)."""
        return {str(r): [str(a) for a in acts] for r, acts in self.actions.items()}

    @classmethod
    def from_text(
        cls,
        actions: Mapping[str | int, Sequence[str]],
        *,
        num_stages: int | None = None,
        microbatches: int | None = None,
        kind: str = "custom",
        placement: Sequence[int] = (),
    ) -> Schedule:
        """Build a schedule from rank -> action strings (the inverse of :meth:`to_text`).

        ``num_stages`` and ``microbatches`` default to one more than the largest index used.
        """
        parsed = {_rank_key(r): tuple(Action.parse(t) for t in acts) for r, acts in actions.items()}
        every = [a for acts in parsed.values() for a in acts]
        if not every:
            raise ScheduleError("schedule text holds no actions")
        return cls(
            kind=kind,
            num_ranks=len(parsed),
            num_stages=num_stages if num_stages is not None else 1 + max(a.stage for a in every),
            microbatches=microbatches if microbatches is not None else 1 + max(a.microbatch for a in every),
            actions=parsed,
            placement=tuple(placement),
        )


def _rank_key(key: str | int) -> int:
    try:
        return int(key)
    except ValueError:
        raise ScheduleError(f"schedule text has rank key {key!r}: expected an integer") from None
