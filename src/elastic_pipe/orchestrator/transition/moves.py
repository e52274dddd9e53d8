"""Sending a rank's weights and optimizer state to another rank (the exchanges of a transition's
:class:`~.plan.Transfer` plan, and of a released prefix brought back): tensors travel as one flat buffer per
dtype over ``torch.distributed`` point-to-point (NCCL on GPU, gloo on CPU); the optimizer-state metadata travels as an
encoded :class:`~elastic_pipe.protocol.OptimizerStateHeader` over the gloo control group. Nothing goes through files
and nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import protocol
from elastic_pipe.orchestrator.errors import OrchestratorError

ParamState: TypeAlias = dict[str, Any]  #: one parameter's ``Optimizer.state`` (untyped in torch): tensors, numbers
Group: TypeAlias = "dist.ProcessGroup | None"  #: a process group to send over (``None``: the default group)
__all__ = [
    "drop_foreign_state",
    "recv_optimizer_state",
    "recv_tensors",
    "send_optimizer_state",
    "send_tensors",
    "state_entries",
]


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
