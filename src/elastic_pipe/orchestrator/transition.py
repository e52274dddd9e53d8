"""Moving state between ranks when the layout changes: who holds which sub-layers, who sends what to whom.

Each rank holds only the sub-layers it runs (:func:`held_sublayers`): its stage's active sub-layers and, on
stage-0 ranks, the frozen prefix (stage 0 runs it, or fills the activation cache with it). The other sub-layers
sit on the meta device and take no memory (:mod:`elastic_pipe.models.residency`). A transition therefore sends a
sub-layer only to the ranks that need it in the new layout and lack it in the old one:

* a sub-layer a rank starts to hold comes from one old holder (its stage's replica copies are identical after the
  gradient all-reduce; a frozen sub-layer's copies never change), weights and buffers always, and its optimizer
  state too while it stays active;
* a sub-layer a rank stops holding is freed there, after every transfer is done.

The plan (:func:`plan_transfers`) is a pure function of the two layouts, so every rank computes the same list.
Each :class:`Transfer` is one point-to-point exchange (``torch.distributed.send``/``recv``: NCCL on GPU, gloo on
CPU), run by both ends in the plan's order: the earliest unfinished transfer always has both ends waiting on it, so
the sequence cannot deadlock. Tensors travel as one flat buffer per dtype; the optimizer-state metadata travels as
an encoded :class:`~elastic_pipe.protocol.OptimizerStateHeader` over the gloo control group. Nothing goes through
files and nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import protocol
from elastic_pipe.orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from elastic_pipe.types import Layout

ParamState: TypeAlias = dict[str, Any]  #: one parameter's ``Optimizer.state`` (untyped in torch): tensors, numbers
Group: TypeAlias = "dist.ProcessGroup | None"  #: a process group to send over (``None``: the default group)
__all__ = [
    "RankLayout",
    "Transfer",
    "changed_ranks",
    "drop_foreign_state",
    "held_sublayers",
    "owned_sublayers",
    "plan_transfers",
    "recv_optimizer_state",
    "recv_tensors",
    "send_optimizer_state",
    "send_tensors",
    "state_entries",
]


class RankLayout(Protocol):
    """The part of :class:`elastic_pipe.groups.RankPlan` a transition reads."""

    @property
    def pipeline_groups(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]: ...

    def stage_of(self, rank: int) -> int: ...

    def replica_of(self, rank: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Transfer:
    """Sub-layers that rank ``src`` sends to rank ``dst``.

    Attributes:
        src: global rank holding a current copy.
        dst: global rank that holds them in the new layout and lacks them in the old one.
        sublayers: sub-layer indices, increasing.
        optimizer_state: whether their optimizer state travels too (they stay active) or only weights (frozen).
    """

    src: int
    dst: int
    sublayers: tuple[int, ...]
    optimizer_state: bool


def _position_sublayers(layout: Layout) -> list[range | tuple[int, ...]]:
    """The active sub-layers of each pipeline position (rank of a replica): one stage's range with one stage per
    rank, the layers of its stages (:meth:`~elastic_pipe.types.Layout.placement`, loop style) with several."""
    b = layout.boundaries
    if layout.virtual == 1:
        return [range(b[s], b[s + 1]) for s in range(layout.pipe_len)]
    placement = layout.placement()
    return [tuple(j for lo, hi in placement.ranges_of(p) for j in range(lo, hi)) for p in range(layout.pipe_len)]


def owned_sublayers(layout: Layout, plan: RankLayout, rank: int) -> range | tuple[int, ...]:
    """The sub-layers ``rank`` holds (and trains) under ``layout``: a range with one stage per rank, the layers of
    its stages, increasing, with several."""
    return _position_sublayers(layout)[plan.stage_of(rank)]


def held_sublayers(layout: Layout, plan: RankLayout, rank: int) -> tuple[int, ...]:
    """The sub-layers ``rank`` keeps in memory under ``layout``: its stage's, plus the frozen prefix on stage 0."""
    own = owned_sublayers(layout, plan, rank)
    prefix = range(layout.frozen) if plan.stage_of(rank) == 0 else range(0)
    return (*prefix, *own)


def _holders(layout: Layout, plan: RankLayout, num_sublayers: int) -> list[tuple[int, ...]]:
    """For each sub-layer, the ranks holding it under ``layout`` (increasing)."""
    holders: list[list[int]] = [[] for _ in range(num_sublayers)]
    for position, sublayers in enumerate(_position_sublayers(layout)):
        for j in sublayers:
            holders[j].extend(plan.dp_groups[position])
    for j in range(layout.frozen):
        holders[j].extend(plan.dp_groups[0])
    return [tuple(sorted(set(h))) for h in holders]


def plan_transfers(
    old: Layout, new: Layout, old_plan: RankLayout, new_plan: RankLayout, *, released: int = 0
) -> tuple[Transfer, ...]:
    """What must travel, and between whom, for the job to go from ``old`` to ``new``.

    Every rank that holds a sub-layer under ``new`` and did not under ``old`` receives it from one old holder:
    the one in its own old replica's pipeline when there is one (so the old replicas share the sending), else the
    lowest-ranked old holder.

    Args:
        old: the layout being left.
        new: the layout being entered (``new.frozen >= old.frozen``: frozen layers never thaw here).
        old_plan: rank roles under ``old`` (``groups.plan_spmd(world, old.pipe_len)``).
        new_plan: rank roles under ``new``.
        released: leading sub-layers whose weights the stage-0 ranks released while the activation cache serves
            them (:mod:`.prefix.residency`; at most ``old.frozen``): they travel to no one, since the new stage-0
            ranks fill their cache from the old boundary's entries without them.

    Returns:
        Transfers ordered by (source, destination); sub-layers increasing within each.

    Raises:
        OrchestratorError: if ``new`` thaws layers, the layouts cover different models, or ``released`` exceeds
            ``old.frozen``.
    """
    if not 0 <= released <= old.frozen:
        raise OrchestratorError(f"released must lie in [0, {old.frozen}] (the old frozen prefix), got {released}")
    if new.frozen < old.frozen:
        raise OrchestratorError(f"a transition cannot unfreeze layers: frozen {old.frozen} -> {new.frozen}")
    n = old.boundaries[-1]
    if n != new.boundaries[-1]:
        raise OrchestratorError(f"layouts cover different models: {n} vs {new.boundaries[-1]} sub-layers")
    had, has = _holders(old, old_plan, n), _holders(new, new_plan, n)
    pairs: dict[tuple[int, int, bool], list[int]] = {}
    for j in range(released, n):
        for dst in has[j]:
            if dst in had[j]:
                continue
            mates = set(old_plan.pipeline_groups[old_plan.replica_of(dst)])
            src = min((r for r in had[j] if r in mates), default=had[j][0])
            pairs.setdefault((src, dst, j >= new.frozen), []).append(j)
    return tuple(
        Transfer(src, dst, tuple(sublayers), optimizer_state=active)
        for (src, dst, active), sublayers in sorted(pairs.items())
    )


def changed_ranks(old_plan: RankLayout, new_plan: RankLayout, world_size: int) -> tuple[int, ...]:
    """Ranks whose (replica, stage) role differs between the two plans."""
    return tuple(
        r
        for r in range(world_size)
        if (old_plan.stage_of(r), old_plan.replica_of(r)) != (new_plan.stage_of(r), new_plan.replica_of(r))
    )


# ------------------------------------------------------------------------------------------- point to point
def _by_dtype(tensors: Sequence[torch.Tensor]) -> list[tuple[torch.dtype, list[torch.Tensor]]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return [(dtype, groups[dtype]) for dtype in sorted(groups, key=str)]


def send_tensors(tensors: Sequence[torch.Tensor], dst: int, *, device: torch.device, group: Group = None) -> int:
    """Send ``tensors`` to ``dst``, one flat buffer per dtype (``dst`` calls :func:`recv_tensors` with tensors of
    the same shapes and dtypes); returns the bytes sent."""
    sent = 0
    for _, same in _by_dtype(tensors):
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in same])
        dist.send(flat, dst, group=group)
        sent += flat.numel() * flat.element_size()
    return sent


def recv_tensors(tensors: Sequence[torch.Tensor], src: int, *, device: torch.device, group: Group = None) -> int:
    """Receive into ``tensors`` (in place) what ``src`` sends with :func:`send_tensors`; returns the bytes received."""
    received = 0
    for dtype, same in _by_dtype(tensors):
        flat = torch.empty(sum(t.numel() for t in same), dtype=dtype, device=device)
        dist.recv(flat, src, group=group)
        received += flat.numel() * flat.element_size()
        offset = 0
        with torch.no_grad():
            for t in same:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
    return received


def state_entries(state: ParamState) -> tuple[protocol.StateEntry, ...]:
    """One parameter's optimizer state described for :class:`~elastic_pipe.protocol.OptimizerStateHeader`.

    Raises:
        OrchestratorError: a state value is neither a tensor nor a number.
    """
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


def _send_bytes(payload: bytes, dst: int, group: Group) -> None:
    dist.send(torch.tensor([len(payload)], dtype=torch.int64), dst, group=group)
    dist.send(torch.frombuffer(bytearray(payload), dtype=torch.uint8), dst, group=group)


def _recv_bytes(src: int, group: Group) -> bytes:
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src, group=group)
    buf = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(buf, src, group=group)
    return buf.numpy().tobytes()


def send_optimizer_state(
    states: Sequence[ParamState], dst: int, *, rank: int, device: torch.device, control: Group, group: Group = None
) -> int:
    """Send the optimizer state of some parameters (one dict each, in an order both ends agree on) to ``dst``.

    The header goes over the gloo ``control`` group, the tensors over ``group``. A state that cannot travel sends an
    :class:`~elastic_pipe.protocol.AbortMessage` instead, so the receiver fails too instead of waiting.

    Returns:
        The tensor bytes sent.

    Raises:
        OrchestratorError: a state value is neither a tensor nor a number.
    """
    try:
        header = protocol.OptimizerStateHeader(tuple(state_entries(s) for s in states))
    except (OrchestratorError, protocol.ProtocolError) as exc:
        _send_bytes(protocol.encode(protocol.AbortMessage.from_text(rank, str(exc))), dst, control)
        raise OrchestratorError(f"rank {rank} could not send its optimizer state: {exc}") from exc
    _send_bytes(protocol.encode(header), dst, control)
    tensors = [states[i][e.key] for i, e in header.tensors()]
    return send_tensors(tensors, dst, device=device, group=group) if tensors else 0


def recv_optimizer_state(
    count: int, src: int, *, device: torch.device, control: Group, group: Group = None
) -> tuple[list[ParamState], int]:
    """Receive what :func:`send_optimizer_state` sends for ``count`` parameters.

    Returns:
        The ``count`` state dicts (tensors on the device the sender kept them on: ``step`` on the CPU beside device
        moments) and the tensor bytes received.

    Raises:
        OrchestratorError: the sender aborted, or sent a header for another number of parameters.
    """
    message = protocol.decode_any(_recv_bytes(src, control))
    if isinstance(message, protocol.AbortMessage):
        raise OrchestratorError(f"rank {message.rank} could not send its optimizer state: {message.reason}")
    if not isinstance(message, protocol.OptimizerStateHeader) or len(message.params) != count:
        raise OrchestratorError(f"rank {src} sent no optimizer state header for the {count} parameters")
    states: list[ParamState] = [{e.key: e.value for e in entries if e.kind != "tensor"} for entries in message.params]
    slots: list[tuple[int, str, str, torch.Tensor]] = []
    for i, e in message.tensors():
        assert e.shape is not None and e.dtype is not None and e.device is not None  # tensor entries carry them
        slots.append((i, e.key, e.device, torch.empty(e.shape, dtype=getattr(torch, e.dtype), device=device)))
    received = recv_tensors([t for *_, t in slots], src, device=device, group=group) if slots else 0
    for i, key, where, value in slots:
        states[i][key] = value if where == device.type else value.to(where)
    return states, received


def drop_foreign_state(
    optimizer: torch.optim.Optimizer, sublayers: Sequence[nn.Module], owned: range | tuple[int, ...]
) -> int:
    """Forget optimizer state of parameters this rank does not own (it lives with their owners); returns a count."""
    dropped = 0
    for j, module in enumerate(sublayers):
        if j in owned:
            continue
        for p in module.parameters():
            if optimizer.state.pop(p, None) is not None:
                dropped += 1
    return dropped
