"""Check a schedule before anything runs it.

A valid schedule has, for every (stage, micro-batch): exactly one forward ``F``; and either exactly one full
backward ``B`` or exactly one ``I`` and one ``W`` (never both forms). Every action sits on the rank that holds its
stage; on that rank the forward precedes its backward (``B`` or ``I``) and ``I`` precedes ``W``. Finally the
schedule must not deadlock under point-to-point send/recv between consecutive stages (asynchronous sends,
blocking receives), which the dataflow engine decides by playing it with unit costs.
"""

from __future__ import annotations

from elastic_pipe.schedule.engine import KIND_CODE, run
from elastic_pipe.schedule.errors import CHECK, ScheduleError
from elastic_pipe.schedule.ir import Action, ActionKind, Schedule

__all__ = ["validate"]

_UNIT_COST = 1.0


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` naming the first problem found, or return ``None`` for a valid schedule.

    Raises:
        ScheduleError: an action out of range or on the wrong rank, a missing/duplicated action, a backward before
            its forward, a ``W`` before its ``I``, a mix of ``B`` and ``I``/``W`` for one micro-batch, or a deadlock.
    """
    check_structure(schedule)
    kinds = len(KIND_CODE)
    run(schedule, [[_UNIT_COST] * schedule.num_stages] * kinds, [0.0] * schedule.num_stages)


def check_structure(schedule: Schedule) -> None:
    """Everything :func:`validate` checks except deadlock freedom (cheap: one pass over the actions)."""
    CHECK.instance("schedule", schedule, Schedule)
    num_stages, mbs = schedule.num_stages, schedule.microbatches
    # position[kind][stage * mbs + mb] = index of that action in its rank's list, -1 when absent
    position = {kind: [-1] * (num_stages * mbs) for kind in ActionKind}
    for rank, acts in schedule.actions.items():
        for index, action in enumerate(acts):
            if not isinstance(action, Action):
                raise ScheduleError(
                    f"rank {rank} action #{index} is {action!r}: expected an Action (Action.parse('2F0'))"
                )
            if action.stage >= num_stages or action.microbatch >= mbs:
                raise ScheduleError(
                    f"rank {rank} action #{index} {action} is out of range: stages 0..{num_stages - 1}, "
                    f"micro-batches 0..{mbs - 1}"
                )
            owner = schedule.placement[action.stage]
            if owner != rank:
                raise ScheduleError(f"rank {rank} action #{index} {action}: stage {action.stage} is on rank {owner}")
            slot = action.stage * mbs + action.microbatch
            if position[action.kind][slot] >= 0:
                first = position[action.kind][slot]
                raise ScheduleError(f"rank {rank} runs {action} twice (action #{first} and #{index})")
            position[action.kind][slot] = index
    for stage in range(num_stages):
        for mb in range(mbs):
            slot = stage * mbs + mb
            f, b, i, w = (position[k][slot] for k in (ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W))
            name = f"stage {stage} micro-batch {mb}"
            if f < 0:
                raise ScheduleError(f"{name} has no forward ({stage}F{mb})")
            if b >= 0 and (i >= 0 or w >= 0):
                raise ScheduleError(f"{name} has both a full backward B and a split backward I/W: expected one form")
            if b < 0 and (i < 0 or w < 0):
                raise ScheduleError(
                    f"{name} has no complete backward: expected {stage}B{mb}, or {stage}I{mb} and {stage}W{mb}"
                )
            backward = b if b >= 0 else i
            if backward < f:
                raise ScheduleError(f"{name}: its backward runs before its forward on rank {schedule.placement[stage]}")
            if b < 0 and w < i:
                raise ScheduleError(f"{name}: {stage}W{mb} runs before {stage}I{mb}")
