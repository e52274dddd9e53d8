"""Simulate a schedule with real per-stage costs: makespan, busy/idle time per rank, bubble, activation peaks.

Costs are seconds per micro-batch, given as one number for every stage or one per stage (indexed by stage, so
an interleaved schedule's ``P*V`` stages each get their own). A backward split into ``I`` and ``W`` costs
``input_grad`` and ``weight_grad``; when those are not given each is half of ``backward``. ``overhead`` is host
time added to every compute action (eager PyTorch launches ~1 ms of host work per transformer block and
micro-batch, see docs/schedule.md), ``transfer`` the time a tensor takes to cross from stage ``s`` to ``s + 1``
when they sit on different ranks (one number, or one per hop).

Activation accounting: a forward makes its stage hold one more micro-batch of activations until its backward
ends (``B``), or its ``W`` ends for a split backward, since the weight gradient still reads the stored inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

from elastic_pipe.schedule.engine import run
from elastic_pipe.schedule.errors import CHECK, ScheduleError
from elastic_pipe.schedule.ir import Action, ActionKind, Schedule
from elastic_pipe.schedule.validate import check_structure

__all__ = ["Cost", "Simulation", "simulate"]

#: A cost: the same number for every stage (or hop), or one number per stage (or hop).
Cost = float | Sequence[float]

#: Share of a full backward that each half of a split backward costs when only ``backward`` is given.
_SPLIT_SHARE = 0.5


@dataclass(frozen=True)
class Simulation:
    """The outcome of playing a schedule with given costs.

    Attributes:
        schedule: the simulated schedule.
        makespan: time from the first action's start to the last action's end (s).
        busy: per rank, time spent computing (including host overhead).
        idle: per rank, ``makespan - busy``.
        bubble_fraction: idle share of all rank-time, ``sum(idle) / (num_ranks * makespan)``.
        peak_activations: per stage, the most micro-batches whose activations it holds at once.
        starts: per rank, each action's start time, parallel to ``schedule.actions[rank]``.
        ends: per rank, each action's end time.
    """

    schedule: Schedule
    makespan: float
    busy: tuple[float, ...]
    idle: tuple[float, ...]
    bubble_fraction: float
    peak_activations: tuple[int, ...]
    starts: dict[int, tuple[float, ...]]
    ends: dict[int, tuple[float, ...]]

    def intervals(self, rank: int) -> Iterator[tuple[Action, float, float]]:
        """Yield ``(action, start, end)`` for ``rank`` in execution order."""
        yield from zip(self.schedule.actions[rank], self.starts[rank], self.ends[rank], strict=True)

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain JSON-able data (no per-action times)."""
        return {
            "kind": self.schedule.kind,
            "ranks": self.schedule.num_ranks,
            "stages": self.schedule.num_stages,
            "microbatches": self.schedule.microbatches,
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "busy": list(self.busy),
            "idle": list(self.idle),
            "peak_activations": list(self.peak_activations),
        }


def simulate(
    schedule: Schedule,
    forward: Cost,
    backward: Cost,
    *,
    input_grad: Cost | None = None,
    weight_grad: Cost | None = None,
    transfer: Cost = 0.0,
    overhead: Cost = 0.0,
) -> Simulation:
    """Play ``schedule`` with the given costs (seconds per micro-batch).

    Args:
        schedule: the schedule; it is checked structurally first (deadlocks surface while playing it).
        forward: forward time, one number or one per stage.
        backward: full backward time (``B``), one number or one per stage.
        input_grad: ``I`` time; defaults to half of ``backward``.
        weight_grad: ``W`` time; defaults to half of ``backward``.
        transfer: time for an activation or gradient to cross between ranks, one number or one per hop
            (``num_stages - 1`` values, hop ``s`` joins stage ``s`` and ``s + 1``).
        overhead: host time added to every compute action, one number or one per stage.

    Returns:
        The :class:`Simulation`.

    Raises:
        ScheduleError: invalid schedule, deadlock, or a cost that is negative, not finite or of the wrong length.
    """
    check_structure(schedule)
    n = schedule.num_stages
    fwd = _per_stage("forward", forward, n)
    bwd = _per_stage("backward", backward, n)
    inp = _per_stage("input_grad", input_grad, n) if input_grad is not None else [b * _SPLIT_SHARE for b in bwd]
    wgt = _per_stage("weight_grad", weight_grad, n) if weight_grad is not None else [b * _SPLIT_SHARE for b in bwd]
    extra = _per_stage("overhead", overhead, n)
    hops = _per_stage("transfer", transfer, n - 1) if n > 1 else _per_stage("transfer", transfer, 1)[:0]
    durations = [[c + o for c, o in zip(costs, extra, strict=True)] for costs in (fwd, bwd, inp, wgt)]
    timeline = run(schedule, durations, hops)
    ranks = range(schedule.num_ranks)
    first = min((s[0] for s in timeline.starts.values() if s), default=0.0)
    makespan = max((e[-1] for e in timeline.ends.values() if e), default=0.0) - first
    busy = tuple(math.fsum(e - s for s, e in zip(timeline.starts[r], timeline.ends[r], strict=True)) for r in ranks)
    idle = tuple(max(0.0, makespan - b) for b in busy)
    bubble = math.fsum(idle) / (schedule.num_ranks * makespan) if makespan > 0 else 0.0
    return Simulation(
        schedule=schedule,
        makespan=makespan,
        busy=busy,
        idle=idle,
        bubble_fraction=bubble,
        peak_activations=peak_activations(schedule),
        starts={r: tuple(timeline.starts[r]) for r in ranks},
        ends={r: tuple(timeline.ends[r]) for r in ranks},
    )


def peak_activations(schedule: Schedule) -> tuple[int, ...]:
    """Per stage, the most micro-batches whose activations are held at once (order on the rank decides it)."""
    CHECK.instance("schedule", schedule, Schedule)
    held = [0] * schedule.num_stages
    peak = [0] * schedule.num_stages
    for acts in schedule.actions.values():
        for action in acts:
            if action.kind is ActionKind.F:
                held[action.stage] += 1
                peak[action.stage] = max(peak[action.stage], held[action.stage])
            elif action.kind is not ActionKind.I:
                held[action.stage] -= 1
    return tuple(peak)


def _per_stage(name: str, value: Cost, n: int) -> list[float]:
    if isinstance(value, Real):
        values = [float(value)] * n
    else:
        values = [CHECK.number(f"{name}[{i}]", v) for i, v in enumerate(CHECK.items(name, value))]
    if len(values) != n:
        raise ScheduleError(f"{name} needs 1 or {n} values, got {len(values)}")
    bad = [v for v in values if not math.isfinite(v) or v < 0]
    if bad:
        raise ScheduleError(f"{name} must be finite and >= 0, got {bad[0]!r}")
    return values
