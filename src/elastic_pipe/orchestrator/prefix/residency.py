"""The frozen prefix on stage-0 ranks: released while the activation cache serves it, brought back when it does not.

Stage-0 ranks hold the frozen prefix only to fill the activation cache, to recompute what the cache misses and to
score the evaluation split. Once the cache holds the prefix output of every training sample (every view of it),
and the evaluation split's prefix outputs sit beside it (:class:`PrefixState`, in host memory), no step and no
evaluation runs the prefix, so :func:`settle` releases its weights:

* every stage-0 rank but rank 0 sends them to the meta device (no storage);
* rank 0, stage 0 of replica 0 in every layout, keeps the one copy in host memory (on a CPU device it stays
  where it is): the checkpoint's stage-0 shard, ``trainer.full_state_dict()`` and export read it there, so the
  final model keeps the frozen prefix's weights.

The prefix stays resident, as before, when the cache is off, bypassed (random transforms), not read (``auto``
judged it slower), incomplete (budgets too small), holds entries on the disk tier (a read that fails its CRC-32
is recomputed, which needs the prefix), or when a prefix parameter is tied to a sub-layer after it.

Every rank agrees on the answer (one all-reduce on the control group), so every rank knows who holds what when
the next transition plans its transfers (``released`` of :func:`~.transition.plan_transfers`): the released
sub-layers travel to no one. A transition that freezes deeper then brings the cache (:func:`carry`, through
:func:`~.shared.carry_released`) and the evaluation outputs to the new boundary by running only the newly
frozen sub-layers on the old boundary's entries; those sub-layers reach every new stage-0 rank in the transfer.
When the carried cache does not cover the training split (a boundary whose entries no longer fit), :func:`restore`
first brings the prefix back from rank 0, and the fill proceeds as with a resident prefix. A resume loads the
prefix from the checkpoint's stage-0 shard, fills the cache and releases the prefix again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.models.residency import materialize
from elastic_pipe.models.residency import release as release_to_meta
from elastic_pipe.orchestrator.prefix.reads import covers
from elastic_pipe.orchestrator.prefix.shared import carry_released
from elastic_pipe.orchestrator.transition.holdings import shared_across_sublayers
from elastic_pipe.orchestrator.transition.moves import recv_tensors, send_tensors

if TYPE_CHECKING:
    from elastic_pipe import cache as acache
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix.carry import CacheJob, FillPeers
    from elastic_pipe.orchestrator.prefix.state import PrefixState
    from elastic_pipe.orchestrator.report import PhaseClock
    from elastic_pipe.types import Layout

__all__: list[str] = []  # internal: the package face exports what others use

#: The rank that keeps the released prefix's weights (in host memory): stage 0 of replica 0 in every layout,
#: the rank that writes the checkpoint's stage-0 shard and assembles ``full_state_dict``.
KEEPER = 0
#: Samples per prefix forward (or carry, or broadcast) over the evaluation split.
EVAL_CHUNK = 256
#: Why stage 0 reads the cache at a boundary reached with the prefix released (nothing was measured).
KEPT_REASON = "the cache served the previous boundary completely and the frozen prefix stays released"


def _tensors(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Parameters then buffers of each module, each tensor once, in an order every rank agrees on."""
    out: dict[int, torch.Tensor] = {}
    for m in modules:
        for t in (*(p.data for p in m.parameters()), *m.buffers()):
            out.setdefault(id(t), t)
    return list(out.values())


def _bytes_on(modules: Sequence[nn.Module], device: torch.device | None) -> int:
    """Bytes of the modules' tensors that have storage on ``device``'s type (``None``: wherever, meta too)."""
    unique = {id(t): t for m in modules for t in (*m.parameters(), *m.buffers())}
    return sum(t.numel() * t.element_size() for t in unique.values() if device is None or t.device.type == device.type)


def _tied_beyond(model: nn.Module, frozen: int) -> bool:
    """Whether a parameter of sub-layers ``0:frozen`` is the same tensor as one of a later sub-layer."""
    index = {name: j for j, (name, _) in enumerate(model.named_children())}

    def sub(name: str) -> int:
        return index[name.split(".", 1)[0]]

    return any((sub(a) < frozen) != (sub(b) < frozen) for a, b in shared_across_sublayers(model))


def eligible(ctx: RunContext, cache: acache.ActivationCache, frozen: int) -> bool:
    """Whether this stage-0 rank's cache serves the prefix at ``frozen`` so completely that its weights may go.

    Every training sample (every view) is cached, none on the disk tier (whose reads may fail their CRC-32 and
    be recomputed), and no prefix parameter is tied to a later sub-layer (which still runs).
    """
    if frozen <= 0 or not covers(cache, ctx.train_set, frozen):
        return False
    if any(t.name == "disk" and t.entries for t in cache.stats.tiers):
        return False
    return not _tied_beyond(ctx.model, frozen)


def release(ctx: RunContext, frozen: int) -> int:
    """Release sub-layers ``0:frozen`` on this stage-0 rank (rank :data:`KEEPER` moves them to host memory).

    Returns:
        The bytes of their weights and buffers this rank's device does without now: all of them, except what
        rank :data:`KEEPER` keeps where it was on a CPU device, and a tensor tied to a later sub-layer. Those a
        new stage-0 rank never received (the released part of the old prefix) count too.
    """
    modules = ctx.sublayers[:frozen]
    if ctx.rank == KEEPER:
        for m in modules:
            m.to("cpu")
    else:
        release_to_meta(ctx.model, range(frozen))
    return _bytes_on(modules, None) - _bytes_on(modules, ctx.device)


def restore(ctx: RunContext, layout: Layout, released: int) -> None:
    """Bring sub-layers ``0:released`` back onto every stage-0 rank's device (a collective of the stage-0 ranks):
    rank :data:`KEEPER` moves its copy back and sends it to the others, point to point."""
    modules = ctx.sublayers[:released]
    if ctx.rank == KEEPER:
        for m in modules:
            m.to(ctx.device)
        for dst in ctx.plan(layout).dp_groups[0]:
            if dst != KEEPER:
                send_tensors(_tensors(modules), dst, device=ctx.device)
        return
    materialize(ctx.model, range(released), ctx.device)
    recv_tensors(_tensors(modules), KEEPER, device=ctx.device)


def carry(ctx: RunContext, layout: Layout, state: PrefixState, job: CacheJob, *, peers: FillPeers | None) -> bool:
    """On stage-0 ranks, with the prefix released: bring the cache to ``layout.frozen`` without it.

    Returns:
        Whether the carried cache covers the training split (the same answer on every stage-0 rank). When it
        does not, the prefix is back (:func:`restore`) and ``state.released`` is 0: the caller fills the rest
        as with a resident prefix.
    """
    ok = carry_released(job, peers)
    if not ok:
        restore(ctx, layout, state.released)
        state.forget()
    return ok


def eval_home(cache: acache.ActivationCache, device: torch.device) -> torch.device:
    """Where the evaluation outputs of a released prefix live: on ``device`` when the cache keeps entries there
    (``cache.config.device_budget > 0``), else in host memory.

    On one H200 (ViT-B/16, 808 evaluation samples, 489 MB of float32 outputs) keeping them in pageable host memory
    cost 0.40-0.49 s per transition in copies to the GPU and back, against a few milliseconds of compute to carry
    them through one more block in place.
    """
    return device if cache.config.device_budget > 0 else torch.device("cpu")


def _empty_eval(shape: tuple[int, ...], dtype: torch.dtype, home: torch.device, device: torch.device) -> torch.Tensor:
    """Room for the evaluation outputs at ``home`` (page-locked host memory when the run's device is a GPU)."""
    pinned = home.type == "cpu" and device.type == "cuda"
    return torch.empty(shape, dtype=dtype, device=home, pin_memory=pinned)


def _fill_eval(
    ctx: RunContext, layout: Layout, state: PrefixState, group: dist.ProcessGroup | None, home: torch.device
) -> None:
    """Every stage-0 rank's evaluation outputs at ``layout.frozen``, kept at ``home`` (a collective of the stage-0
    ranks).

    Rank :data:`KEEPER` computes them: from the outputs it kept at the previous boundary through the newly frozen
    sub-layers when the prefix is released (in place, chunk by chunk), else through the whole prefix from the
    inputs; then it broadcasts them to the other stage-0 ranks, which carry nothing themselves.
    """
    frozen, device = layout.frozen, ctx.device
    n = len(ctx.eval_set)
    example = ctx.prefix_example(frozen)
    shape, dtype = (n, *example.shape[1:]), example.dtype
    chunks = [list(range(lo, min(lo + EVAL_CHUNK, n))) for lo in range(0, n, EVAL_CHUNK)]
    kept = state.eval_values
    reuse = kept is not None and tuple(kept.shape) == shape and kept.dtype == dtype and kept.device == home
    values = kept if reuse and kept is not None else _empty_eval(shape, dtype, home, device)
    if ctx.rank == KEEPER:
        carried = bool(state.released) and kept is not None
        if carried and state.eval_frozen != frozen:
            assert kept is not None
            old = state.eval_frozen
            for rows in chunks:  # each chunk is read before it is overwritten
                lo, hi = rows[0], rows[-1] + 1
                out = ctx.run_sublayers(kept[lo:hi].to(device, non_blocking=True), old, frozen)
                values[lo:hi].copy_(out, non_blocking=True)
        elif not carried:
            for batch in ctx.eval_set.batches(chunks, inputs=True, labels=False, device=device):
                assert batch.inputs is not None
                values[batch.positions] = ctx.run_sublayers(batch.inputs, 0, frozen).to(home)
    if group is not None and len(ctx.plan(layout).dp_groups[0]) > 1:
        for rows in chunks:
            part = values[rows[0] : rows[-1] + 1]
            if part.device == device:
                buf = part
            else:
                buf = part.to(device) if ctx.rank == KEEPER else torch.empty_like(part, device=device)
            dist.broadcast(buf, src=KEEPER, group=group)
            if buf is not part and ctx.rank != KEEPER:
                part.copy_(buf)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the host-side copies landed before anyone reads them
    state.eval_frozen, state.eval_values = frozen, values


def settle(
    ctx: RunContext,
    layout: Layout,
    state: PrefixState,
    *,
    first: bool,
    serving: acache.ActivationCache | None,
    clock: PhaseClock | None = None,
) -> int:
    """After the cache is set up for ``layout``: release the frozen prefix on every stage-0 rank when all of them
    are :func:`eligible`, else make sure it is resident (a collective on the control group); ``state`` follows.

    Args:
        first: whether this rank runs stage 0 in ``layout``.
        serving: the cache stage 0 reads in ``layout`` (``None``: it reads none, or this rank is not stage 0).
        clock: a transition's clock: laps ``eval_store`` (the evaluation outputs) and ``prefix`` (release or
            restore).

    Returns:
        The device bytes of frozen-prefix weights the job's stage-0 ranks do without in this layout (summed over
        the job, :func:`release`; 0 when the prefix is resident).
    """
    frozen = layout.frozen
    mine = True
    if first:
        mine = serving is not None and eligible(ctx, serving, frozen)
    flag = torch.tensor([1.0 if mine and frozen > 0 else 0.0])
    control = ctx.groups.control_group
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=control)
    freed = 0
    if flag.item() > 0:
        if first:
            group = ctx.groups.dp_group(layout.pipe_len) if layout.replicas > 1 else None
            assert serving is not None  # eligible: the cache serves the prefix
            with torch.no_grad():
                _fill_eval(ctx, layout, state, group, eval_home(serving, ctx.device))
            if clock is not None:
                clock.lap("eval_store")
            freed = release(ctx, frozen)
        state.released = frozen
    else:
        if first and state.released:
            restore(ctx, layout, state.released)
        state.forget()
    total = torch.tensor([freed], dtype=torch.int64)
    dist.all_reduce(total, group=control)
    if clock is not None:
        clock.lap("prefix")
    return int(total)
