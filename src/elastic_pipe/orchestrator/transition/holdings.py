"""What one rank keeps in memory, and how a transition hands sub-layers to their new holders.

A rank holds only :func:`~.plan.held_sublayers`: its stage's active sub-layers and,
on stage-0 ranks, the frozen prefix. Everything else stays on the meta device (shapes, no storage:
:func:`elastic_pipe.models.residency.release`), and the optimizer covers only the rank's own trainable parameters.

At the start the model is on the meta device (the config's builders build it there), so each rank materializes
on its device only what it holds, each sub-layer's values from the model's recipe
(:func:`elastic_pipe.models.weights.materialize_sublayers`: the same seeded values on every rank, or only this
rank's tensors of a pretrained checkpoint). A model passed with real weights on the CPU works too: each rank moves
what it holds to its device and releases the rest (:func:`hold`).

At a transition (:func:`transfer`) each rank first gives real storage to the sub-layers it starts to hold, then
runs the planned point-to-point transfers (a gained sub-layer comes from its old holder, never from the model's
recipe or a checkpoint file), then frees what it no longer holds and points the optimizer at what it owns now.
Parameters are replaced, not resized, when they are materialised or released, so the optimizer's parameter lists
are rebuilt here each time (:func:`point_optimizer`); the parameters a rank keeps keep their identity and so their
optimizer state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.models.residency import materialize, release
from elastic_pipe.models.weights import materialize_sublayers
from elastic_pipe.orchestrator.optim import can_fuse
from elastic_pipe.orchestrator.transition.moves import (
    recv_optimizer_state,
    recv_tensors,
    send_optimizer_state,
    send_tensors,
)
from elastic_pipe.orchestrator.transition.plan import Transfer, held_sublayers, plan_transfers

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.types import Layout

__all__ = [
    "assemble",
    "fuse_on_device",
    "held_bytes",
    "hold",
    "param_groups_by_name",
    "point_optimizer",
    "shared_across_sublayers",
    "sublayer_keys",
    "transfer",
]


def sublayer_keys(model: nn.Module) -> list[list[str]]:
    """The state-dict keys of each sub-layer of ``model``, in state-dict order."""
    index = {name: j for j, (name, _) in enumerate(model.named_children())}
    keys: list[list[str]] = [[] for _ in index]
    for key in model.state_dict(keep_vars=True):
        keys[index[key.split(".", 1)[0]]].append(key)
    return keys


def shared_across_sublayers(model: nn.Module) -> list[tuple[str, str]]:
    """Pairs of parameter names of two different sub-layers of ``model`` that are one tensor (a tied head).

    Each rank holds only its stage's sub-layers, so a parameter shared by two sub-layers would be two copies on
    two ranks once a pipeline puts them on different stages, with nothing keeping them equal.
    """
    first: dict[int, str] = {}
    pairs: list[tuple[str, str]] = []
    for sub_name, sub in model.named_children():
        seen_here: set[int] = set()
        for name, p in sub.named_parameters(remove_duplicate=False):
            key = id(p)
            if key in first and key not in seen_here and not first[key].startswith(f"{sub_name}."):
                pairs.append((first[key], f"{sub_name}.{name}"))
            first.setdefault(key, f"{sub_name}.{name}")
            seen_here.add(key)
    return pairs


def _is_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def _module_tensors(modules: Iterable[nn.Module]) -> list[torch.Tensor]:
    """Parameters then buffers of each module, in an order every rank agrees on."""
    out: list[torch.Tensor] = []
    for m in modules:
        out.extend(p.data for p in m.parameters())
        out.extend(m.buffers())
    return out


def param_groups_by_name(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, int]:
    """Which of ``optimizer``'s parameter groups each of ``model``'s parameters is in (by name)."""
    group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
    return {name: group_of[id(p)] for name, p in model.named_parameters() if id(p) in group_of}


def point_optimizer(ctx: RunContext, optimizer: torch.optim.Optimizer, layout: Layout) -> None:
    """Make ``optimizer`` cover exactly this rank's trainable parameters under ``layout``; drop any other state.

    Each parameter goes to the group it was in when the optimizer was built over the whole model
    (``ctx.param_group_of``); the groups' hyper-parameters stay as they are.
    """
    owned = set(ctx.owned(layout))
    index = {name: j for j, (name, _) in enumerate(ctx.model.named_children())}
    groups: list[list[nn.Parameter]] = [[] for _ in optimizer.param_groups]
    seen: set[int] = set()
    for name, p in ctx.model.named_parameters():
        g = ctx.param_group_of.get(name)
        if g is None or index[name.split(".", 1)[0]] not in owned or not p.requires_grad or p.is_meta:
            continue
        seen.add(id(p))
        groups[g].append(p)
    for group, params in zip(optimizer.param_groups, groups, strict=True):
        group["params"] = params
    for stale in [t for t in optimizer.state if id(t) not in seen]:
        del optimizer.state[stale]


def fuse_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Let an AdamW that was built over CPU parameters run fused once every parameter it covers is on a GPU.

    The config's AdamW runs fused on a GPU (:func:`~elastic_pipe.orchestrator.optim.optimizer_factory`), but the
    trainer builds it over the whole model (on the meta device, or the CPU), before the rank's sub-layers reach the
    device; this turns fusion on when they have. State it already holds (a checkpoint's, restored before the stage
    is built) keeps its values, its step counts moved to the parameter's device as float32, where a fused step keeps
    them: a resumed run then steps as the uninterrupted one did (fused and multi-tensor AdamW differ in the last
    bits). Returns whether it turned fusion on.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if (
        not isinstance(optimizer, torch.optim.AdamW)
        or optimizer.defaults.get("fused") is not None
        or not can_fuse(params)
    ):
        return False
    optimizer.defaults["fused"] = True
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, None
    for p, state in optimizer.state.items():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.to(device=p.device, dtype=torch.float32)
    return True


def hold(ctx: RunContext, layout: Layout, *, fill: bool = True) -> tuple[int, ...]:
    """Keep exactly ``layout``'s held sub-layers on this rank's device (no collective).

    A held sub-layer on the meta device gets storage on the device and, with ``fill``, its values from the model's
    ``sublayer_init`` (:func:`~elastic_pipe.models.weights.materialize_sublayers`); one with storage elsewhere (a
    model passed with real weights on the CPU) moves to the device, keeping its parameters; every other sub-layer
    is released.

    Args:
        ctx: the rank's facts.
        layout: the layout to hold.
        fill: initialize the sub-layers that were on the meta device; ``False`` leaves them uninitialized, for a
            caller that overwrites every one of their tensors (a resume from a checkpoint).

    Returns:
        The held sub-layers that were on the meta device.

    Raises:
        MaterializeError: ``fill`` and a held sub-layer is on the meta device of a model with no ``sublayer_init``.
    """
    model = ctx.model
    held = held_sublayers(layout, ctx.plan(layout), ctx.rank)
    fresh = tuple(j for j in held if _is_meta(ctx.sublayers[j]))
    if fresh:
        if fill:
            materialize_sublayers(model, fresh, ctx.device)
        else:
            materialize(model, fresh, ctx.device)
    for j in held:
        if j not in fresh:
            ctx.sublayers[j].to(ctx.device)
    release(model, [j for j in range(len(ctx.sublayers)) if j not in held])
    return fresh


def held_bytes(ctx: RunContext, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds: parameters with storage, and the tensors of ``optimizer``'s state."""
    params = sum(p.numel() * p.element_size() for p in ctx.model.parameters() if not p.is_meta)
    state = 0
    if optimizer is not None:
        for s in optimizer.state.values():
            state += sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
    return {"parameters": params, "optimizer": state}


def _params(modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    return [p for m in modules for p in m.parameters()]


def _run(ctx: RunContext, t: Transfer, optimizer: torch.optim.Optimizer) -> int:
    """This rank's end of one transfer; returns the bytes it received."""
    modules = [ctx.sublayers[j] for j in t.sublayers]
    control = ctx.groups.control_group
    if ctx.rank == t.src:
        send_tensors(_module_tensors(modules), t.dst, device=ctx.device)
        if t.optimizer_state:
            states = [optimizer.state.get(p, {}) for p in _params(modules)]
            send_optimizer_state(states, t.dst, rank=ctx.rank, device=ctx.device, control=control)
        return 0
    received = recv_tensors(_module_tensors(modules), t.src, device=ctx.device)
    if t.optimizer_state:
        params = _params(modules)
        states, n = recv_optimizer_state(len(params), t.src, device=ctx.device, control=control)
        received += n
        for p, s in zip(params, states, strict=True):
            if s:
                optimizer.state[p] = s
    return received


def transfer(
    ctx: RunContext, old: Layout, new: Layout, optimizer: torch.optim.Optimizer, *, released: int = 0
) -> tuple[int, int]:
    """Hand every sub-layer to its new holders and free it where it is no longer held (a collective).

    Args:
        released: leading sub-layers the stage-0 ranks released while the activation cache serves them
            (:mod:`.prefix.residency`): nobody sends, receives, materialises or frees them here.

    Returns:
        The bytes this rank received and the bytes the whole job received (weights, buffers, optimizer state).
    """
    transfers = plan_transfers(old, new, ctx.plan(old), ctx.plan(new), released=released)
    held_now = {j for j in held_sublayers(old, ctx.plan(old), ctx.rank) if j >= released}
    held_next = tuple(j for j in held_sublayers(new, ctx.plan(new), ctx.rank) if j >= released)
    incoming = [j for j in held_next if j not in held_now]
    if incoming:
        materialize(ctx.model, incoming, ctx.device)
    received = 0
    for t in transfers:
        if ctx.rank in (t.src, t.dst):
            received += _run(ctx, t, optimizer)
    release(ctx.model, [j for j in held_now if j not in held_next])
    point_optimizer(ctx, optimizer, new)
    total = torch.tensor([received], dtype=torch.int64)
    dist.all_reduce(total, group=ctx.groups.control_group)
    return received, int(total)


def assemble(ctx: RunContext, layout: Layout, dst: int = 0) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank ``dst``, on the CPU (a collective: replica 0 of each stage sends).

    Returns:
        On ``dst`` every tensor of the model's ``state_dict`` (copies: tied tensors come out as separate equal
        tensors), in the model's key order; ``{}`` elsewhere.
    """
    plan = ctx.plan(layout)
    keys = ctx.sublayer_keys
    local = ctx.model.state_dict(keep_vars=True)
    out: dict[str, torch.Tensor] = {}
    for src in plan.pipeline_groups[0]:
        sublayers = held_sublayers(layout, plan, src)
        names = [k for j in sublayers for k in keys[j]]
        if src == dst == ctx.rank:
            out.update({k: local[k].detach().to("cpu", copy=True) for k in names})
        elif ctx.rank == src:
            send_tensors([local[k] for k in names], dst, device=ctx.device)
        elif ctx.rank == dst:
            buffers = [torch.empty(local[k].shape, dtype=local[k].dtype, device=ctx.device) for k in names]
            recv_tensors(buffers, src, device=ctx.device)
            out.update({k: b.to("cpu") for k, b in zip(names, buffers, strict=True)})
    if ctx.rank != dst:
        return {}
    return {k: out[k] for k in local}
