"""Moving state between ranks when the layout changes: who sends which sub-layers, and the sending itself.

Every rank holds the whole model (same seed, same initial weights), but only the sub-layers of its own stage are
authoritative: they receive gradients and carry optimizer state. The copies of other sub-layers are stale. A
transition therefore only has to refresh the copies that become authoritative somewhere new:

* a sub-layer that becomes **frozen** is sent to every rank (any stage-0 rank may run the frozen prefix);
* an **active** sub-layer whose new owners are not all among its old owners is sent, weights and optimizer state,
  from one old owner (replica 0 of its old stage: after the gradient all-reduce every replica holds the same bits).

The plan (:func:`plan_moves`) is a pure function of the old and new layouts, so every rank computes the same list
and issues the same collectives in the same order. Tensors travel with ``torch.distributed.broadcast`` (one
flattened buffer per source and dtype; NCCL on GPU, gloo on CPU) and the optimizer-state metadata as JSON over
the gloo control group. Nothing goes through files and nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import protocol
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.types import Layout

__all__ = [
    "BroadcastBytes",
    "Move",
    "RankLayout",
    "apply_moves",
    "changed_ranks",
    "drop_foreign_state",
    "owned_sublayers",
    "plan_gather",
    "plan_moves",
]

#: ``broadcast_bytes(payload_or_None, src) -> payload`` over the control group (``GroupManager.broadcast_bytes``).
BroadcastBytes = Callable[[bytes | None, int], bytes]


class RankLayout(Protocol):
    """The part of :class:`elastic_pipe.groups.RankPlan` a transition reads."""

    @property
    def pipeline_groups(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]: ...

    def stage_of(self, rank: int) -> int: ...

    def replica_of(self, rank: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Move:
    """Sub-layers that rank ``src`` broadcasts to every rank.

    Attributes:
        src: global rank holding the authoritative copy.
        sublayers: sub-layer indices, increasing.
        optimizer_state: whether their optimizer state travels too (active sub-layers) or only weights (frozen).
    """

    src: int
    sublayers: tuple[int, ...]
    optimizer_state: bool


def _stage_ranges(layout: Layout) -> list[range]:
    b = layout.boundaries
    return [range(b[s], b[s + 1]) for s in range(layout.pipe_len)]


def owned_sublayers(layout: Layout, plan: RankLayout, rank: int) -> range:
    """The sub-layers ``rank`` holds (and trains) under ``layout``."""
    return _stage_ranges(layout)[plan.stage_of(rank)]


def plan_moves(old: Layout, new: Layout, old_plan: RankLayout, new_plan: RankLayout) -> tuple[Move, ...]:
    """What must travel for the job to go from ``old`` to ``new``.

    Args:
        old: the layout being left.
        new: the layout being entered (``new.frozen >= old.frozen``: frozen layers never thaw here).
        old_plan: rank roles under ``old`` (``groups.plan_spmd(world, old.pipe_len)``).
        new_plan: rank roles under ``new``.

    Returns:
        Moves ordered by old stage, frozen sub-layers (weights only) before moved active ones.

    Raises:
        OrchestratorError: if ``new`` thaws layers or the layouts cover different models.
    """
    if new.frozen < old.frozen:
        raise OrchestratorError(f"a transition cannot unfreeze layers: frozen {old.frozen} -> {new.frozen}")
    if old.boundaries[-1] != new.boundaries[-1]:
        raise OrchestratorError(
            f"layouts cover different models: {old.boundaries[-1]} vs {new.boundaries[-1]} sub-layers"
        )
    new_owners = {j: frozenset(new_plan.dp_groups[s]) for s, r in enumerate(_stage_ranges(new)) for j in r}
    moves: list[Move] = []
    for s, sublayers in enumerate(_stage_ranges(old)):
        src = old_plan.pipeline_groups[0][s]
        old_owners = frozenset(old_plan.dp_groups[s])
        frozen = tuple(j for j in sublayers if j < new.frozen)
        moved = tuple(j for j in sublayers if j >= new.frozen and not new_owners[j] <= old_owners)
        if frozen:
            moves.append(Move(src, frozen, optimizer_state=False))
        if moved:
            moves.append(Move(src, moved, optimizer_state=True))
    return tuple(moves)


def plan_gather(layout: Layout, plan: RankLayout) -> tuple[Move, ...]:
    """Moves that make every rank's copy of every active sub-layer current (for evaluation and checkpoints)."""
    return tuple(
        Move(plan.pipeline_groups[0][s], tuple(r), optimizer_state=True) for s, r in enumerate(_stage_ranges(layout))
    )


def changed_ranks(old_plan: RankLayout, new_plan: RankLayout, world_size: int) -> tuple[int, ...]:
    """Ranks whose (replica, stage) role differs between the two plans."""
    return tuple(
        r
        for r in range(world_size)
        if (old_plan.stage_of(r), old_plan.replica_of(r)) != (new_plan.stage_of(r), new_plan.replica_of(r))
    )


def _tensors(modules: Iterable[nn.Module]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for m in modules:
        out.extend(p.data for p in m.parameters())
        out.extend(b for b in m.buffers())
    return out


def _broadcast_tensors(tensors: Sequence[torch.Tensor], src: int, group: dist.ProcessGroup | None) -> int:
    """Broadcast ``tensors`` in place from ``src``, one flat buffer per dtype; returns the bytes sent."""
    sent = 0
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype in sorted(by_dtype, key=str):
        group_tensors = by_dtype[dtype]
        flat = torch.cat([t.reshape(-1) for t in group_tensors])
        dist.broadcast(flat, src=src, group=group)
        sent += flat.numel() * flat.element_size()
        offset = 0
        for t in group_tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n
    return sent


def _state_entries(state: dict[str, Any]) -> tuple[protocol.StateEntry, ...]:
    """One parameter's optimizer state described for :class:`~elastic_pipe.protocol.OptimizerStateHeader`."""
    entries = []
    for key in sorted(state):
        value = state[key]
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            entries.append(protocol.StateEntry.tensor(key, dtype, tuple(value.shape), value.device.type))
        else:
            try:
                entries.append(protocol.StateEntry.scalar(key, value))
            except protocol.ProtocolError:
                raise OrchestratorError(
                    f"optimizer state {key!r} holds a {type(value).__name__}; only tensors and numbers travel"
                ) from None
    return tuple(entries)


def _broadcast_optimizer_state(
    params: Sequence[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    src: int,
    *,
    rank: int,
    device: torch.device,
    group: dist.ProcessGroup | None,
    broadcast_bytes: BroadcastBytes,
    keep: Sequence[bool],
) -> int:
    payload = None
    if rank == src:
        try:
            header = protocol.OptimizerStateHeader(tuple(_state_entries(optimizer.state.get(p, {})) for p in params))
            payload = protocol.encode(header)
        except (OrchestratorError, protocol.ProtocolError) as exc:  # the receivers stop too, instead of waiting
            payload = protocol.encode(protocol.AbortMessage.from_text(rank, str(exc)))
    message = protocol.decode_any(broadcast_bytes(payload, src))
    if isinstance(message, protocol.AbortMessage):
        raise OrchestratorError(f"rank {message.rank} could not send its optimizer state: {message.reason}")
    if not isinstance(message, protocol.OptimizerStateHeader) or len(message.params) != len(params):
        raise OrchestratorError(f"rank {src} sent no optimizer state header for the {len(params)} parameters")
    buffers: list[torch.Tensor] = []
    slots: list[tuple[int, str, str]] = []
    for i, e in message.tensors():
        assert e.shape is not None and e.dtype is not None and e.device is not None  # tensor entries carry them
        if rank == src:
            buffers.append(optimizer.state[params[i]][e.key].detach().to(device).clone())
        else:
            buffers.append(torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=device))
        slots.append((i, e.key, e.device))
    sent = _broadcast_tensors(buffers, src, group) if buffers else 0
    received: list[dict[str, Any]] = [
        {e.key: e.value for e in entries if e.kind != "tensor"} for entries in message.params
    ]
    for (i, key, where), value in zip(slots, buffers, strict=True):
        received[i][key] = value if where == device.type else value.to(where)
    if rank != src:
        for p, state, wanted in zip(params, received, keep, strict=True):
            if wanted and state:
                optimizer.state[p] = state
    return sent


def apply_moves(
    moves: Sequence[Move],
    sublayers: Sequence[nn.Module],
    optimizer: torch.optim.Optimizer | None,
    *,
    rank: int,
    device: torch.device,
    keep_state: Callable[[int], bool],
    broadcast_bytes: BroadcastBytes,
    group: dist.ProcessGroup | None = None,
) -> int:
    """Run ``moves`` (a collective: every rank calls it with the same moves).

    Args:
        moves: from :func:`plan_moves` or :func:`plan_gather`.
        sublayers: the model's sub-layers, indexable by sub-layer index.
        optimizer: this rank's optimizer; ``None`` sends weights only.
        rank: this rank.
        device: where tensors travel (the training device: NCCL needs GPU tensors).
        keep_state: whether this rank keeps the received optimizer state of sub-layer ``j`` (it owns ``j`` now).
        broadcast_bytes: the control group's byte broadcast (for the optimizer-state metadata).
        group: the group the tensors travel on (``None``: the default, world group).

    Returns:
        Bytes broadcast (payload, counted once per move).
    """
    sent = 0
    for move in moves:
        modules = [sublayers[j] for j in move.sublayers]
        sent += _broadcast_tensors(_tensors(modules), move.src, group)
        if move.optimizer_state and optimizer is not None:
            params: list[nn.Parameter] = []
            keep: list[bool] = []
            for j, m in zip(move.sublayers, modules, strict=True):
                own = list(m.parameters())
                params.extend(own)
                keep.extend([keep_state(j)] * len(own))
            sent += _broadcast_optimizer_state(
                params,
                optimizer,
                move.src,
                rank=rank,
                device=device,
                group=group,
                broadcast_bytes=broadcast_bytes,
                keep=keep,
            )
    return sent


def drop_foreign_state(optimizer: torch.optim.Optimizer, sublayers: Sequence[nn.Module], owned: range) -> int:
    """Forget optimizer state of parameters this rank does not own (it lives with their owners); returns a count."""
    dropped = 0
    for j, module in enumerate(sublayers):
        if j in owned:
            continue
        for p in module.parameters():
            if optimizer.state.pop(p, None) is not None:
                dropped += 1
    return dropped
