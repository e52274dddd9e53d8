"""Applying a decided transition on one rank, and its record.

Every rank applies the :class:`~elastic_pipe.protocol.TransitionMessage` rank 0 decided (:mod:`.layout.executor`): move
the sub-layers whose owner changes (weights and optimizer state, :mod:`.transition`), freeze the new prefix (its
parameters leave the optimizer), build the new :class:`~.stage.StageRuntime`, and bring the run's
:class:`~.prefix.FrozenPrefix` to the new boundary (its activation cache carried there); :func:`event_for` makes
the :class:`~.report.records.TransitionEvent` of what it did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from elastic_pipe import freeze, protocol
from elastic_pipe.orchestrator.launch import maybe_fail
from elastic_pipe.orchestrator.layout import layout_from_message
from elastic_pipe.orchestrator.report import PhaseClock, TransitionEvent
from elastic_pipe.orchestrator.stage import StageRuntime, probe, step_record
from elastic_pipe.orchestrator.transition import drop_foreign_state, transfer

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix, PrefixReport
    from elastic_pipe.orchestrator.state import RunState

__all__ = ["TRANSITION_PHASES", "Applied", "apply", "event_for"]

#: The parts of a transition timed separately (seconds on rank 0, in :attr:`TransitionEvent.phases`; the
#: decision before them is ``decide``): weights and optimizer state to new owners, freezing the new prefix,
#: building the new stage, the probe's baseline, carrying or filling the activation cache, refreshing the
#: evaluation outputs kept for a released prefix, and releasing or restoring the prefix's weights. The first steps
#: of the new layout add ``compile`` and ``capture`` to the run's result (:meth:`.trainer.ElasticTrainer.fit`).
TRANSITION_PHASES = ("moves", "freeze", "runner", "probe", "cache", "eval_store", "prefix")


@dataclass
class Applied:
    """What applying a message changed on this rank.

    Attributes:
        state: the state in the new layout.
        stage: the new stage (the old one is closed).
        bytes_moved: bytes the job's ranks received (weights, buffers and optimizer state, summed over ranks).
        phases: seconds per part of :data:`TRANSITION_PHASES`.
        prefix: what entering the new layout did to the frozen prefix.
        spent: the old stage's compile and capture seconds not yet in an epoch record (``{"compile": s,
            "capture": s}``): a transition inside an epoch replaces the runner that measured them.
    """

    state: RunState
    stage: StageRuntime
    bytes_moved: int
    phases: dict[str, float]
    prefix: PrefixReport
    spent: dict[str, float]


def apply(
    ctx: RunContext,
    state: RunState,
    stage: StageRuntime,
    msg: protocol.TransitionMessage,
    *,
    optimizer: torch.optim.Optimizer,
    prefix: FrozenPrefix,
    epoch_step: int = 0,
    before: Callable[[], None] | None = None,
) -> Applied | None:
    """Apply a decoded message on this rank (a collective); ``None`` when the layout stays as it is.

    Args:
        epoch_step: steps of the epoch done before the decision point (for the fault hook).
        before: called once the layout is known to change, before anything moves (inside an epoch, the step loop
            leaves its batches there); a decision that changes nothing costs the epoch no restart of its reads.
    """
    old = state.layout
    new = layout_from_message(msg, ctx.world_size)
    if new == old:
        return None
    if before is not None:
        before()
    maybe_fail("transition", ctx.rank, msg.epoch, epoch_step)
    clock = PhaseClock(ctx.device, TRANSITION_PHASES)
    clock.start()
    sublayers = ctx.sublayers
    new_owned = ctx.owned(new)
    # the bytes every rank received, summed over the job; a released prefix travels to no one
    _, moved = transfer(ctx, old, new, optimizer, released=prefix.released)
    clock.lap("moves")
    maybe_fail("moved", ctx.rank, msg.epoch, None)  # after the moves, before the freeze and the rebuild
    if new.frozen > old.frozen:
        freeze.freeze_modules(sublayers[old.frozen : new.frozen], optimizer)
    ctx.restore_modes(new, True)
    drop_foreign_state(optimizer, sublayers, new_owned)
    clock.lap("freeze")
    record = step_record(stage.runner, None)  # taken before the runner goes
    spent = {"compile": float(record["compile_s"]), "capture": float(record["capture_s"])}
    stage.close()
    frozen_units = sum(1 for end in ctx.unit_ends if end <= new.frozen)
    new_stage = StageRuntime(ctx, new)
    clock.lap("runner")
    # the units changed owners: each rank keeps the outputs of those it holds now
    probe.baseline(ctx, new_stage, prefix)
    clock.lap("probe")
    report = prefix.enter(new, old.frozen, step=state.step, clock=clock)
    new_state = state.replace(layout=new, frozen_units=frozen_units)
    return Applied(new_state, new_stage, moved, dict(clock.totals), report, spent)


def event_for(
    msg: protocol.TransitionMessage, applied: Applied, *, decide_s: float, seconds: float, epoch_step: int = 0
) -> TransitionEvent:
    """The record of an applied transition (``epoch_step``: steps of its epoch done before it)."""
    state, layout = applied.state, applied.state.layout
    return TransitionEvent(
        epoch=state.epoch,
        step=state.step,
        frozen_units=state.frozen_units,
        frozen=layout.frozen,
        pipe_len=layout.pipe_len,
        replicas=layout.replicas,
        microbatches=layout.microbatches,
        boundaries=tuple(layout.boundaries),
        changed_ranks=tuple(msg.changed_ranks),
        bytes_moved=applied.bytes_moved,
        cache=applied.prefix.cache,
        prefix_released_bytes=applied.prefix.released_bytes,
        seconds=seconds,
        phases={k: round(v, 6) for k, v in {"decide": decide_s, **applied.phases}.items()},
        epoch_step=epoch_step,
        cache_entries=applied.prefix.cache_entries,
        cache_bytes=applied.prefix.cache_bytes,
        virtual=layout.virtual,
    )
