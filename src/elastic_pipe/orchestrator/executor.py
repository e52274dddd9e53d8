"""A decision point, as data then action: rank 0 decides a :class:`~elastic_pipe.protocol.TransitionMessage`, every
rank applies it.

Decide: gather per-unit gradient statistics to rank 0 (only when the policy reads them; one gather per decision
point), or measure the probe's output drift (:mod:`.probe`, for a probe-driven policy), ask the policy
(:func:`elastic_pipe.freeze.decide` checks its answer), cap the frozen count so the pipeline keeps enough active
sub-layers, compute the next layout with the layout rule (:mod:`.layout_rule`), and broadcast the encoded message
on the gloo control group (:func:`.decision.announce`; rank 0's error travels instead, so every rank stops at once).

Apply: move the sub-layers whose owner changes (weights and optimizer state, :mod:`.transition`), freeze the new
prefix (its parameters leave the optimizer), build the new :class:`~.stage.StageRuntime`, and bring the
run's :class:`~.prefix.FrozenPrefix` to the new boundary (its activation cache carried there).

A decision point follows every epoch but the last, or, with ``[freeze] decide_every = N``, every N-th optimizer
step of the run, inside an epoch too (the trainer's step loop hands over to it there; ``epoch_step`` says how many
of the epoch's steps came before it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe import freeze, protocol
from elastic_pipe.freeze.probe import ProbePolicy
from elastic_pipe.groups import BarrierTimeoutError, GroupManager
from elastic_pipe.orchestrator import decision, layout_rule
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.holdings import transfer
from elastic_pipe.orchestrator.launch import maybe_fail
from elastic_pipe.orchestrator.metrics import TransitionEvent
from elastic_pipe.orchestrator.stage import StageRuntime, probe
from elastic_pipe.orchestrator.state import RunState
from elastic_pipe.orchestrator.timing import PhaseClock
from elastic_pipe.orchestrator.transition import changed_ranks, drop_foreign_state

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix, PrefixReport

__all__ = [
    "TRANSITION_PHASES",
    "Applied",
    "apply",
    "decide",
    "event_for",
    "gather_stats",
    "initial_state",
    "meet",
    "timed_decision",
]

#: The parts of a transition timed separately (seconds on rank 0, in :attr:`TransitionEvent.phases`; the
#: decision before them is ``decide``): weights and optimizer state to new owners, freezing the new prefix,
#: building the new stage, the probe's baseline, carrying or filling the activation cache, refreshing the
#: evaluation outputs kept for a released prefix, and releasing or restoring the prefix's weights. The first steps
#: of the new layout add ``compile`` and ``capture`` to the run's result (:meth:`.trainer.ElasticTrainer.fit`).
TRANSITION_PHASES = ("moves", "freeze", "runner", "probe", "cache", "eval_store", "prefix")


def initial_state(ctx: RunContext) -> RunState:
    """The run's start (a collective): rank 0 partitions the sub-layers over the initial length and broadcasts
    the layout; its bottleneck becomes the budget compression respects."""
    c = ctx.config

    def initial() -> protocol.TransitionMessage:
        # with [pipeline] memory_budget: the shortest pipeline whose every rank fits it
        layout, budget = layout_rule.start_layout(
            ctx.costs,
            ctx.groups.pipe_lens,
            ctx.world_size,
            solver=ctx.parts.partitioner,
            microbatches_for=c.microbatches_for,
            memory=ctx.memory,
        )
        return decision.message_for(layout, epoch=0, step=0, budget=budget, changed=())

    msg = decision.announce(initial, rank=ctx.rank, broadcast_bytes=ctx.broadcast_bytes)
    return RunState(decision.layout_from_message(msg, ctx.world_size), msg.max_cost_at_start)


def meet(groups: GroupManager, where: str, rank: int) -> None:
    """Wait until every rank reaches ``where``: one monitored barrier on the gloo control group (a collective).

    Every collective already has the configured timeout, but a timed-out gather or broadcast cannot say who is
    missing; the barrier can, so a dead, hung or slow peer is named within the timeout instead.

    Args:
        groups: the run's :class:`~elastic_pipe.groups.GroupManager`.
        where: the point, for the message ("the decision point before epoch 3").
        rank: this rank.

    Raises:
        OrchestratorError: some rank did not arrive within the timeout; rank 0 names it, the others say that
            rank 0 did not release them.
    """
    try:
        groups.barrier()
    except BarrierTimeoutError as exc:
        silent = exc.silent
        who = (
            f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}"
            if silent
            else "a peer (rank 0 names it)"
        )
        raise OrchestratorError(
            f"rank {rank}: {who} did not reach {where} within {groups.timeout:g} s (dead, hung or too slow; "
            "[launch] timeout sets the limit)"
        ) from exc


def gather_stats(ctx: RunContext, stage: StageRuntime) -> freeze.LayerStats | None:
    """Per-unit gradient statistics of the interval, merged on rank 0 (a collective on the control group).

    The steps summed the gradients on the device without reading anything back; here each rank reads its norms
    once (:meth:`~elastic_pipe.freeze.GradNormTracker.local_stats`) and one gather brings the pieces to rank 0.
    ``None`` elsewhere, and on every rank when the policy does not read them.
    """
    if not ctx.track_gradients:
        return None
    n_units = len(ctx.unit_ends)
    mine = stage.tracker.local_stats(n_units)
    if stage.replica != 0:  # replicas hold identical (all-reduced) gradients: replica 0 speaks for all
        mine = freeze.LayerStats.zeros(n_units, mine.steps)
    flat = mine.to_tensor()
    pieces = [torch.zeros_like(flat) for _ in range(ctx.world_size)] if ctx.rank == 0 else None
    dist.gather(flat, pieces, dst=0, group=ctx.groups.control_group)
    stage.tracker.reset()
    if pieces is None:
        return None
    return freeze.merge_stats([freeze.LayerStats.from_tensor(p) for p in pieces])


def decide(
    ctx: RunContext,
    state: RunState,
    stage: StageRuntime,
    *,
    prefix: FrozenPrefix,
    eval_loss: float | None = None,
    epoch_step: int = 0,
) -> protocol.TransitionMessage:
    """The decision point before ``state.epoch``, or inside it after ``epoch_step`` of its steps (a collective);
    every rank returns the same message.

    The policy is asked with ``state.epoch`` (the epoch the next step belongs to) and ``state.step`` (optimizer
    steps of the run so far), after it observed the statistics gathered since the previous decision point.

    Raises:
        OrchestratorError: a rank did not reach the decision point within the timeout (named), or rank 0 could
            not decide.
    """
    where = (
        f"the decision point after step {epoch_step} of epoch {state.epoch + 1}"
        if epoch_step
        else f"the decision point before epoch {state.epoch + 1}"
    )
    meet(ctx.groups, where, ctx.rank)
    stats = gather_stats(ctx, stage)
    change = probe.measure(ctx, stage, prefix)  # the probe's output drift, for a policy that reads it
    current = state.layout
    policy, rule = ctx.parts.policy, ctx.parts.compression

    def next_message() -> protocol.TransitionMessage:
        if stats is not None:
            policy.observe(stats)
        if change is not None and isinstance(policy, ProbePolicy):  # measured only for a policy that reads it
            policy.observe_drift(change)
        if eval_loss is not None:
            policy.observe_eval(eval_loss)
        units = layout_rule.decide_units(  # the one rule, as the dry run applies it
            policy,
            epoch=state.epoch,
            step=state.step,
            current=state.frozen_units,
            unit_ends=ctx.unit_ends,
            num_sublayers=len(ctx.costs),
            pipe_len=current.pipe_len,
            compression=rule,
        )
        layout = layout_rule.next_layout(
            current,
            layout_rule.frozen_sublayers(ctx.unit_ends, units),
            ctx.costs,
            compression=rule,
            solver=ctx.parts.partitioner,
            budget=state.budget,
            world_size=ctx.world_size,
            microbatches_for=ctx.config.microbatches_for,
            memory=ctx.memory,
        )
        changed = changed_ranks(ctx.plan(current), ctx.plan(layout), ctx.world_size)
        return decision.message_for(
            layout,
            epoch=state.epoch,
            step=state.step,
            budget=state.budget,
            changed=changed,
        )

    return decision.announce(next_message, rank=ctx.rank, broadcast_bytes=ctx.broadcast_bytes)


@dataclass
class Applied:
    """What applying a message changed on this rank.

    Attributes:
        state: the state in the new layout.
        stage: the new stage (the old one is closed).
        bytes_moved: bytes the job's ranks received (weights, buffers and optimizer state, summed over ranks).
        phases: seconds per part of :data:`TRANSITION_PHASES`.
        prefix: what entering the new layout did to the frozen prefix.
    """

    state: RunState
    stage: StageRuntime
    bytes_moved: int
    phases: dict[str, float]
    prefix: PrefixReport


def apply(
    ctx: RunContext,
    state: RunState,
    stage: StageRuntime,
    msg: protocol.TransitionMessage,
    *,
    optimizer: torch.optim.Optimizer,
    prefix: FrozenPrefix,
    epoch_step: int = 0,
) -> Applied | None:
    """Apply a decoded message on this rank (a collective); ``None`` when the layout stays as it is.

    Args:
        epoch_step: steps of the epoch done before the decision point (for the fault hook).
    """
    old = state.layout
    new = decision.layout_from_message(msg, ctx.world_size)
    if new == old:
        return None
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
    stage.close()
    frozen_units = sum(1 for end in ctx.unit_ends if end <= new.frozen)
    new_stage = StageRuntime(ctx, new)
    clock.lap("runner")
    # the units changed owners: each rank keeps the outputs of those it holds now
    probe.baseline(ctx, new_stage, prefix)
    clock.lap("probe")
    report = prefix.enter(new, old.frozen, clock=clock)
    return Applied(state.replace(layout=new, frozen_units=frozen_units), new_stage, moved, dict(clock.totals), report)


def timed_decision(
    ctx: RunContext,
    state: RunState,
    stage: StageRuntime,
    *,
    prefix: FrozenPrefix,
    optimizer: torch.optim.Optimizer,
    eval_loss: float | None = None,
    epoch_step: int = 0,
) -> tuple[protocol.TransitionMessage, Applied | None, float, float]:
    """:func:`decide` then :func:`apply`; returns the message, what changed, the decide seconds and the total.

    Args:
        epoch_step: steps of ``state.epoch`` done before the decision point (0: at the epoch's start).
    """
    t0 = time.perf_counter()
    msg = decide(ctx, state, stage, prefix=prefix, eval_loss=eval_loss, epoch_step=epoch_step)
    decide_s = time.perf_counter() - t0
    applied = apply(ctx, state, stage, msg, optimizer=optimizer, prefix=prefix, epoch_step=epoch_step)
    if applied is not None and ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return msg, applied, decide_s, time.perf_counter() - t0


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
    )
