"""A rank's share of the training state as checkpoint parts (:class:`~.parts.Stateful`), restored on any layout.

Each rank saves the weights of the sub-layers it holds (:class:`Weights`, the ``model`` part) and the optimizer
state of the parameters it owns, by name (:class:`OptimizerShare`, the ``optimizer`` part); a checkpoint
(:mod:`.checkpoint`) writes one such share per stage. Loading takes from a saved state - one whole state, or
shards read on demand (:class:`~elastic_pipe.orchestrator.persist.shards.ShardedCheckpoint`) - only what this rank
holds in the resumed layout, whatever layout or world size wrote it: the position (:func:`position`, loaded first)
says which layout that is - the saved one, its active sub-layers re-cut when the config's stages per rank differ
(a probe-driven policy's kept outputs are regrouped by rank then, :func:`regroup_probe`). :class:`RngState` and
:class:`InferenceRecord` are the ``rng`` and ``inference`` parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from elastic_pipe import freeze
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.layout import virtual_rule, with_virtual
from elastic_pipe.orchestrator.persist.exported import inference_record
from elastic_pipe.orchestrator.state import RunState
from elastic_pipe.orchestrator.transition import assemble, hold, point_optimizer

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.state import RunStateRecord
    from elastic_pipe.types import Layout

__all__ = ["InferenceRecord", "OptimizerShare", "RngState", "Weights", "full_model", "position", "regroup_probe"]


def _held_keys(ctx: RunContext, layout: Layout) -> list[str]:
    return [k for j in ctx.held(layout) for k in ctx.sublayer_keys[j]]


def position(ctx: RunContext, saved: RunStateRecord) -> RunState:
    """A saved position (:meth:`RunState.to_dict`) on this world size, with this run's ``[pipeline] virtual``
    stages per rank: the saved layout (its frozen prefix, its ranks) is continued, its active sub-layers cut into
    the config's v stages per rank when the checkpoint's v differs
    (:func:`~elastic_pipe.orchestrator.layout.with_virtual`; under ``"auto"`` the v the layout rule chooses for the
    saved layout's length); the weights and the optimizer state, loaded after it, are placed by that layout.

    Raises:
        OrchestratorError: the saved pipeline length cannot run on this world size, or its active sub-layers
            cannot fill the config's v stages per rank.
    """
    pipe_len = int(saved["layout"]["pipe_len"])
    if ctx.world_size % pipe_len or pipe_len not in ctx.groups.pipe_lens:
        raise OrchestratorError(
            f"the checkpoint's pipeline length {pipe_len} cannot run on {ctx.world_size} processes "
            f"(possible lengths: {list(ctx.groups.pipe_lens)})"
        )
    state = RunState.from_dict(saved, ctx.world_size)
    layout = with_virtual(
        state.layout,
        virtual_rule(ctx.config.pipeline.virtual, ctx.parts.schedule),
        ctx.costs,
        solver=ctx.parts.partitioner,
        world_size=ctx.world_size,
        microbatches_for=ctx.config.microbatches_for,
    )
    return state.replace(layout=layout)


def regroup_probe(
    saved: Mapping[str, Mapping[str, torch.Tensor]], layout: Layout, unit_ends: Sequence[int]
) -> dict[str, dict[str, torch.Tensor]]:
    """A checkpoint's probe outputs (by pipeline position of the layout that saved them, :func:`.stage.probe.kept`)
    by position of ``layout``: each position gets the units that end on one of its stages (a resume that changed
    the stages per rank; reads every position's piece).

    Args:
        saved: by position (a string), the outputs of the units ending there, by unit (a string).
        layout: the layout the resume enters.
        unit_ends: where each freeze unit ends (sub-layer index, exclusive).
    """
    every = {u: h for piece in saved.values() for u, h in piece.items()}
    placement = layout.placement()
    return {
        str(p): {
            u: h for u, h in every.items() if any(lo < unit_ends[int(u)] <= hi for lo, hi in placement.ranges_of(p))
        }
        for p in range(layout.pipe_len)
    }


class Weights:
    """The ``model`` part: the weights of the sub-layers this rank holds in the current layout, by model key.

    A released frozen prefix (:mod:`~elastic_pipe.orchestrator.prefix.residency`) is in rank 0's share only, which
    keeps it in host memory: rank 0 writes the stage-0 shard.

    Args:
        ctx: the rank's facts.
        layout: the current layout (when saving) or the saved one (when loading: the position is loaded first).
    """

    def __init__(self, ctx: RunContext, layout: Callable[[], Layout]) -> None:
        self.ctx = ctx
        self.layout = layout

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The held weights, copied to the CPU (no collective)."""
        local = self.ctx.model.state_dict(keep_vars=True)
        return {k: local[k].detach().cpu() for k in _held_keys(self.ctx, self.layout()) if not local[k].is_meta}

    def load_state_dict(self, saved: Mapping[str, torch.Tensor], /) -> None:
        """Hold the saved layout's sub-layers and copy their weights from ``saved`` (any mapping holding at least
        this rank's: a sharded checkpoint reads only the tensors asked for).

        Raises:
            OrchestratorError: ``saved`` lacks a tensor this rank holds.
        """
        ctx, layout = self.ctx, self.layout()
        # every held tensor, a released frozen prefix's too, is overwritten below from the saved state: nothing to
        # initialize or read, and the prefix comes back resident (the caller tells the run's FrozenPrefix)
        hold(ctx, layout, fill=False)
        local = ctx.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for key in _held_keys(ctx, layout):
                if key not in saved:
                    raise OrchestratorError(f"the checkpoint holds no tensor {key!r}")
                local[key].copy_(saved[key])


class OptimizerShare:
    """The ``optimizer`` part: the state of the parameters this rank owns in the current layout, by parameter
    name (``state``), and the hyper-parameters (``param_groups``).

    Args:
        ctx: the rank's facts.
        optimizer: the run's optimizer.
        layout: the current layout (when saving) or the saved one (when loading, after :class:`Weights`).
    """

    def __init__(self, ctx: RunContext, optimizer: torch.optim.Optimizer, layout: Callable[[], Layout]) -> None:
        self.ctx = ctx
        self.optimizer = optimizer
        self.layout = layout

    def state_dict(self) -> dict[str, object]:
        """``{"state", "param_groups"}``, tensors copied to the CPU (no collective)."""
        names = {id(p): name for name, p in self.ctx.model.named_parameters()}
        return {
            "state": {
                names[id(p)]: {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
                for p, s in self.optimizer.state.items()
            },
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups],
        }

    def load_state_dict(self, saved: Mapping[str, Any], /) -> None:
        """Take the frozen prefix out of the optimizer, point it at this rank's parameters in the saved layout, and
        load their state (``saved["state"]``: any mapping holding at least this rank's) and the hyper-parameters."""
        ctx, optimizer, layout = self.ctx, self.optimizer, self.layout()
        if layout.frozen:
            freeze.freeze_modules(ctx.sublayers[: layout.frozen], optimizer)
        point_optimizer(ctx, optimizer, layout)
        states: Mapping[str, Mapping[str, object]] = saved["state"]
        # A fused optimizer keeps its step count beside the parameters; the others keep it on the host.
        fused = bool(optimizer.defaults.get("fused"))
        owned = set(ctx.owned(layout))
        index = {name: j for j, (name, _) in enumerate(ctx.model.named_children())}
        for name, p in ctx.model.named_parameters():
            if index[name.split(".", 1)[0]] not in owned or not p.requires_grad:
                continue
            s = states.get(name)
            if s:
                optimizer.state[p] = {
                    k: (v.to(ctx.device) if isinstance(v, torch.Tensor) and (fused or k != "step") else v)
                    for k, v in s.items()
                }
        for group, kept in zip(optimizer.param_groups, saved["param_groups"], strict=False):
            # hyper-parameters come back; how the update runs (fused or not) is this machine's choice
            group.update({k: v for k, v in kept.items() if k not in ("fused", "foreach")})


class RngState:
    """The ``rng`` part: the CPU generator's state (the steps reseed it; a resume sets it back all the same)."""

    def state_dict(self) -> torch.Tensor:
        """``torch.get_rng_state()``."""
        return torch.get_rng_state()

    def load_state_dict(self, saved: torch.Tensor, /) -> None:
        """``torch.set_rng_state(saved)``."""
        torch.set_rng_state(saved)


class InferenceRecord:
    """The ``inference`` part: what an exported model needs (:func:`.exported.inference_record`: its ``[model]``
    table and the input standardisation or tokenizer), kept in every checkpoint for ``elastic-pipe export``.

    A resume does not read it back: the run's config and data give it again.
    """

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def state_dict(self) -> dict[str, object]:
        """The record of this run's config and data."""
        return inference_record(self.ctx.config, self.ctx.train_set, self.ctx.parts.data)

    def load_state_dict(self, saved: object, /) -> None:
        """Nothing to restore (see the class)."""


def full_model(ctx: RunContext, layout: Layout) -> dict[str, torch.Tensor]:
    """The whole trained model's weights on rank 0 (a collective: replica 0 of each stage sends its sub-layers).

    Returns:
        On rank 0 the model's ``state_dict`` with every tensor on the CPU (a copy: tied tensors come out as
        separate equal tensors, ready for ``safetensors``); ``{}`` on the other ranks.
    """
    return assemble(ctx, layout)
