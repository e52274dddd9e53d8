"""``[pipeline] virtual = "auto"``: the number of stages per rank v each layout gets, chosen by the layout rule.

:func:`choose_virtual` is the one choice, a pure function of the active sub-layers' costs, the pipeline length K,
the micro-batch count and the schedule, so every rank (and the dry run, ``elastic-pipe plan --config``) makes the
same one. It is called only when a layout is made (the first, each transition's, a resume's), never per step.

The candidates are the v from 1 to :data:`elastic_pipe.schedule.MAX_AUTO_VIRTUAL` that the schedule's generator
accepts (:func:`elastic_pipe.schedule.accepts`: ``1f1b`` and ``zb1p`` 1, ``interleaved`` 2 and more, ``gpipe``
any) and whose ``K * v`` stages each get an active sub-layer. Each is priced by the schedule simulator
(:func:`elastic_pipe.schedule.simulate`): the active sub-layers partitioned over ``K * v`` stages by the run's
solver, a stage's forward the sum of its sub-layers' costs, its backward twice that (the ``B = 2F`` of
docs/schedule.md), and a per-hop cost ``hop`` added both to every compute action (host launch work) and to every
crossing between ranks (the transfer). The smallest simulated step wins; ties go to the smaller v.

The per-hop cost is derived from the costs, so it works in any unit (parameters, seconds): :data:`HOP_SHARE` of
the mean active sub-layer's cost. More stages per rank cut the bubble (about ``(K - 1) / (v M)`` of the step) but
add ``2 M (v - 1)`` compute actions per rank and more crossings; the hop cost is what keeps v from growing for
nothing (with K = 1 there is no bubble and v = 1 always wins).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastic_pipe import partition as part
from elastic_pipe import schedule as sched

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.layout.compression import Solver

__all__ = ["AutoVirtual", "choose_virtual", "stages_per_rank", "virtual_rule"]  # the face, siblings

#: Per-hop cost as a share of the mean active sub-layer's cost (one compute action's host work, one crossing).
HOP_SHARE = 0.1
#: Backward costs this many forwards (the convention of docs/schedule.md's timelines).
BACKWARD_PER_FORWARD = 2.0


@dataclass(frozen=True)
class AutoVirtual:
    """``[pipeline] virtual = "auto"`` for ``schedule``: each layout's v comes from :func:`choose_virtual`.

    Attributes:
        schedule: the run's schedule kind.
        most: the largest v tried.
        hop_share: the per-hop cost as a share of the mean active sub-layer's cost.
    """

    schedule: str
    most: int = sched.MAX_AUTO_VIRTUAL
    hop_share: float = HOP_SHARE

    @property
    def fewest(self) -> int:
        """The smallest v the schedule runs (what the freeze cap must leave room for); 1 when it runs none."""
        return next((v for v in range(1, self.most + 1) if sched.accepts(self.schedule, 1, 1, v)), 1)

    def choose(self, active: Sequence[float], pipe_len: int, microbatches: int, solver: Solver) -> int:
        """:func:`choose_virtual` with this setting."""
        return choose_virtual(
            active, pipe_len, microbatches, self.schedule, solver=solver, most=self.most, hop_share=self.hop_share
        )


def stages_per_rank(
    virtual: int | AutoVirtual, active: Sequence[float], pipe_len: int, microbatches: int, solver: Solver
) -> int:
    """The v of a new layout: ``virtual`` itself when fixed, else :meth:`AutoVirtual.choose`'s."""
    return virtual if isinstance(virtual, int) else virtual.choose(active, pipe_len, microbatches, solver)


def virtual_rule(value: int | str, schedule: str) -> int | AutoVirtual:
    """``[pipeline] virtual`` (checked by the config: an int, or the string ``"auto"``) as the layout rule takes
    it: a fixed v, or :class:`AutoVirtual` for ``schedule``."""
    return value if isinstance(value, int) else AutoVirtual(schedule)


def virtual_steps(
    active: Sequence[float],
    pipe_len: int,
    microbatches: int,
    schedule: str,
    *,
    solver: Solver,
    most: int = sched.MAX_AUTO_VIRTUAL,
    hop_share: float = HOP_SHARE,
) -> dict[int, sched.Simulation]:
    """Per candidate v (see the module docstring), the simulated step of ``active`` cut into ``pipe_len * v``
    stages; empty when no v from 1 to ``most`` both runs under ``schedule`` and leaves every stage a sub-layer.
    A v the solver refuses to cut (the published greedy rule can leave a stage empty) is no candidate."""
    hop = hop_share * math.fsum(active) / len(active) if active else 0.0
    out: dict[int, sched.Simulation] = {}
    for v in range(1, most + 1):
        if pipe_len * v > len(active):
            continue
        try:
            plan = sched.generate(schedule, pipe_len, microbatches, v)
            stages = part.solve(list(active), pipe_len * v, solver)
        except (sched.ScheduleError, part.PartitionError):
            continue  # the schedule does not run this v, or the solver cannot cut this many stages
        forward = [math.fsum(active[lo:hi]) for lo, hi in zip(stages.boundaries, stages.boundaries[1:], strict=False)]
        backward = [BACKWARD_PER_FORWARD * f for f in forward]
        out[v] = sched.simulate(plan, forward, backward, transfer=hop, overhead=hop)
    return out


def choose_virtual(
    active: Sequence[float],
    pipe_len: int,
    microbatches: int,
    schedule: str,
    *,
    solver: Solver,
    most: int = sched.MAX_AUTO_VIRTUAL,
    hop_share: float = HOP_SHARE,
) -> int:
    """The v with the smallest simulated step (:func:`virtual_steps`), the smaller v on a tie.

    When no v leaves every one of ``pipe_len * v`` stages a sub-layer, the smallest v the schedule runs (the
    layout rule then shortens the pipeline, as for a fixed v; a schedule that runs none is refused before the run
    starts, ``check_runnable_schedule``).

    Args:
        active: the active sub-layers' costs, in order.
        pipe_len: the pipeline length K.
        microbatches: micro-batches per step at this K.
        schedule: the schedule kind.
        solver: the partition solver.
        most: the largest v tried.
        hop_share: the per-hop cost as a share of the mean active sub-layer's cost.
    """
    steps = virtual_steps(active, pipe_len, microbatches, schedule, solver=solver, most=most, hop_share=hop_share)
    if steps:
        return min(steps, key=lambda v: (steps[v].makespan, v))
    return AutoVirtual(schedule, most).fewest
