"""The dataflow engine shared by the validator and the simulator (internal).

Each rank runs its action list in order. An action starts when its rank is free and its inputs are there: a
forward needs the previous stage's forward of the same micro-batch, a backward (``B`` or ``I``) needs its own
forward and the next stage's input gradient, a ``W`` needs its own ``I``. Sends are asynchronous (a rank never
waits for its peer to receive) and receives block at the point of use, which is how
torch.distributed.pipelining runs a schedule. A tensor crossing ranks arrives ``transfer`` seconds after the
producing action ends; stages on the same rank hand tensors over for free.

The engine is event-driven: when a rank reaches an action whose input is not there yet, it parks on that input;
the completion of the producing action wakes it. Every action is therefore visited once (O(actions)), and a rank
left parked when no rank can move is a deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elastic_pipe.schedule.errors import ScheduleError
from elastic_pipe.schedule.ir import ActionKind, Schedule

__all__ = ["KIND_CODE", "Timeline", "run"]

#: Integer codes of the action kinds, the index into per-kind duration tables.
KIND_CODE: dict[ActionKind, int] = {ActionKind.F: 0, ActionKind.B: 1, ActionKind.I: 2, ActionKind.W: 3}
_F, _B, _I, _W = 0, 1, 2, 3
#: How many dependency slots each (stage, micro-batch) has: its forward output and its input gradient.
_SLOTS = 2
_NOT_DONE = -1.0


@dataclass(frozen=True)
class Timeline:
    """Start and end times of every action, parallel to ``schedule.actions[rank]``."""

    starts: dict[int, list[float]]
    ends: dict[int, list[float]]


def run(schedule: Schedule, durations: Sequence[Sequence[float]], hops: Sequence[float]) -> Timeline:
    """Play ``schedule`` with ``durations[kind_code][stage]`` and ``hops[s]`` (stage s -> s+1 transfer time).

    Assumes the schedule is structurally sound (see :func:`elastic_pipe.schedule.validate`).

    Raises:
        ScheduleError: the schedule deadlocks; the message names each stuck rank's next action and its input.
    """
    num_stages, mbs = schedule.num_stages, schedule.microbatches
    place = schedule.placement
    last = num_stages - 1
    grad_base = num_stages * mbs
    done = [_NOT_DONE] * (_SLOTS * grad_base)
    codes = {r: [(KIND_CODE[a.kind], a.stage, a.microbatch) for a in acts] for r, acts in schedule.actions.items()}
    ptr = dict.fromkeys(codes, 0)
    clock = dict.fromkeys(codes, 0.0)
    starts: dict[int, list[float]] = {r: [] for r in codes}
    ends: dict[int, list[float]] = {r: [] for r in codes}
    parked: dict[int, list[int]] = {}
    runnable = list(codes)
    park = parked.setdefault
    while runnable:
        rank = runnable.pop()
        acts, p, now = codes[rank], ptr[rank], clock[rank]
        count = len(acts)
        push_start, push_end = starts[rank].append, ends[rank].append
        while p < count:
            code, stage, mb = acts[p]
            slot = stage * mbs + mb
            if code == _F:
                if stage:
                    need = slot - mbs
                    ready = done[need]
                    if ready >= 0 and place[stage - 1] != rank:
                        ready += hops[stage - 1]
                else:
                    ready = 0.0
            elif code == _W:
                need = grad_base + slot
                ready = done[need]
            else:
                need = slot
                ready = done[slot]
                if ready >= 0 and stage < last:
                    need = grad_base + slot + mbs
                    grad = done[need]
                    if grad < 0:
                        ready = grad
                    else:
                        if place[stage + 1] != rank:
                            grad += hops[stage]
                        ready = max(ready, grad)
            if ready < 0:
                park(need, []).append(rank)
                break
            start = now if now > ready else ready
            now = start + durations[code][stage]
            push_start(start)
            push_end(now)
            p += 1
            if code != _W:
                produced = slot if code == _F else grad_base + slot
                done[produced] = now
                if produced in parked:
                    runnable.extend(parked.pop(produced))
        ptr[rank], clock[rank] = p, now
    stuck = {r: p for r, p in ptr.items() if p < len(codes[r])}
    if stuck:
        detail = "; ".join(
            f"rank {r} waits at {schedule.actions[r][p]} (action #{p})" for r, p in sorted(stuck.items())
        )
        raise ScheduleError(f"schedule {schedule.kind!r} deadlocks under point-to-point send/recv: {detail}")
    return Timeline(starts, ends)
