"""A decision point, as data then action: rank 0 decides a :class:`~elastic_pipe.protocol.TransitionMessage`, every
rank applies it.

Decide: gather per-unit gradient statistics to rank 0 (only when the policy reads them; one gather per decision point),
or measure the probe's output drift (:mod:`~elastic_pipe.orchestrator.stage.probe`, for a probe-driven policy), ask the
policy (:func:`elastic_pipe.freeze.decide` checks its answer), cap the frozen count so the pipeline keeps enough active
sub-layers, compute the next layout with the layout rule (:mod:`.rule`), and broadcast the encoded message on the gloo
control group (:func:`.decision.announce`; rank 0's error travels instead, so every rank stops at once).

Apply (:mod:`~elastic_pipe.orchestrator.apply_transition`): move the sub-layers whose owner changes (weights and
optimizer state, :mod:`~elastic_pipe.orchestrator.transition`), freeze the new prefix (its parameters leave the
optimizer), build the new :class:`~elastic_pipe.orchestrator.stage.StageRuntime`, and bring the run's
:class:`~elastic_pipe.orchestrator.prefix.FrozenPrefix` to the new boundary (its activation cache carried there).

A decision point follows every epoch but the last, or, with ``[freeze] decide_every = N``, every N-th optimizer
step of the run, inside an epoch too (the step loop returns to the trainer there, which decides and applies;
``epoch_step`` says how many of the epoch's steps came before it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe import freeze, protocol
from elastic_pipe.groups import BarrierTimeoutError, GroupManager
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.layout import decision, rule, start
from elastic_pipe.orchestrator.layout.virtual_choice import virtual_rule
from elastic_pipe.orchestrator.stage import StageRuntime, probe
from elastic_pipe.orchestrator.state import RunState
from elastic_pipe.orchestrator.transition import changed_ranks

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix

__all__ = ["decide", "initial_state"]  # for the trainer, through the module


def initial_state(ctx: RunContext) -> RunState:
    """The run's start (a collective): rank 0 partitions the sub-layers over the initial length and broadcasts
    the layout; its bottleneck becomes the budget compression respects."""
    c = ctx.config

    def initial() -> protocol.TransitionMessage:
        # with [pipeline] memory_budget: the shortest pipeline whose every rank fits it
        layout, budget = start.start_layout(
            ctx.costs,
            ctx.groups.pipe_lens,
            ctx.world_size,
            solver=ctx.parts.partitioner,
            microbatches_for=c.microbatches_for,
            memory=ctx.memory,
            virtual=virtual_rule(c.pipeline.virtual, ctx.parts.schedule),
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
    policy, compression = ctx.parts.policy, ctx.parts.compression
    virtual = virtual_rule(ctx.config.pipeline.virtual, ctx.parts.schedule)

    def next_message() -> protocol.TransitionMessage:
        if stats is not None:
            policy.observe(stats)
        if change is not None and isinstance(policy, freeze.ProbePolicy):  # measured only for a policy that reads it
            policy.observe_drift(change)
        if eval_loss is not None:
            policy.observe_eval(eval_loss)
        units = rule.decide_units(  # the one rule, as the dry run applies it
            policy,
            epoch=state.epoch,
            step=state.step,
            current=state.frozen_units,
            unit_ends=ctx.unit_ends,
            num_sublayers=len(ctx.costs),
            pipe_len=current.pipe_len,
            compression=compression,
            virtual=virtual,
        )
        layout = rule.next_layout(
            current,
            rule.frozen_sublayers(ctx.unit_ends, units),
            ctx.costs,
            compression=compression,
            solver=ctx.parts.partitioner,
            budget=state.budget,
            world_size=ctx.world_size,
            microbatches_for=ctx.config.microbatches_for,
            memory=ctx.memory,
            virtual=virtual,
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
