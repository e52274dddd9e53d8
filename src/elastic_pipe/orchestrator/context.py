"""What one rank knows for the whole run, whatever the layout: its place in the job, the model, the data, the parts.

A :class:`RunContext` is built once by the trainer and handed to the parts that change with the layout
(:class:`~elastic_pipe.orchestrator.stage.StageRuntime`, the step loop, the transition executor,
evaluation) and to the run's frozen prefix (:class:`~elastic_pipe.orchestrator.prefix.FrozenPrefix`, which owns
what the run knows about the prefix). It holds no layout: everything layout-dependent takes a
:class:`~elastic_pipe.types.Layout`.

The model's structure is whole on every rank, but only the sub-layers a rank holds have storage
(:mod:`.transition.holdings`); the others are on the meta device. What every rank needs to know about the sub-layers
it does not hold - their activations' shapes, their parameters' names and sizes - is taken once at setup, without
materializing the model (:mod:`.setup`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from elastic_pipe.orchestrator.transition import held_sublayers, owned_sublayers

if TYPE_CHECKING:  # the context holds these parts; it builds none of them (setup does)
    from elastic_pipe.groups import GroupManager, RankPlan
    from elastic_pipe.models import SubLayerModel
    from elastic_pipe.orchestrator.components import Components
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.orchestrator.data import EpochPlan, StepData
    from elastic_pipe.orchestrator.layout import MemoryBudget
    from elastic_pipe.orchestrator.report import EventLog
    from elastic_pipe.types import Layout

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    """One rank's fixed facts and shared helpers (frozen: nothing in it changes during the run).

    Attributes:
        config: the run's numbers.
        parts: the composed components (policy, solver, compression rule, schedule, loss).
        rank: this rank.
        world_size: the number of ranks.
        device: this rank's device.
        groups: the process groups of every reachable pipeline length.
        train_set: the training split (the same on every rank): tensors in memory or a dataset's index subset.
        eval_set: the evaluation split.
        log: where rank 0 writes records and human lines.
        costs: per-sub-layer cost the partition balances.
        epoch: how an epoch of the training split is cut into steps (the same in every layout).
        compiled: compiled wrappers of the sub-layers (``[train] compile``), from which stages are built; ``None``
            runs stages eagerly.
        examples: one sample's activation at every sub-layer boundary (``examples[j]`` enters sub-layer ``j``,
            ``examples[-1]`` is the model's output), on the device, taken at setup in eval mode: the shapes and
            dtypes a stage declares, whatever it holds.
        sublayer_keys: the state-dict keys of each sub-layer.
        param_bytes: parameter bytes of each sub-layer.
    """

    config: TrainConfig
    parts: Components
    rank: int
    world_size: int
    device: torch.device
    groups: GroupManager
    train_set: StepData
    eval_set: StepData
    log: EventLog
    costs: list[float]
    epoch: EpochPlan
    compiled: list[nn.Module] | None = None
    examples: list[torch.Tensor] = field(default_factory=list)
    sublayer_keys: list[list[str]] = field(default_factory=list)
    param_bytes: list[int] = field(default_factory=list)
    #: The per-rank memory budget every layout must fit (``[pipeline] memory_budget``), or ``None``.
    memory: MemoryBudget | None = None
    #: The optimizer group of each parameter (by name), as the optimizer was built over the whole model.
    param_group_of: dict[str, int] = field(default_factory=dict)
    #: The training split's sample ids on the host, where the cache looks them up: ids on a GPU would
    #: synchronise the host with the device at every cached step.
    host_ids: torch.Tensor = field(init=False)
    _sublayers: list[nn.Module] = field(init=False)

    def __post_init__(self) -> None:
        # the two derived fields of a frozen dataclass, set once here
        object.__setattr__(self, "host_ids", self.train_set.sample_ids.to("cpu", torch.int64))
        # the model's sub-layers never change during a run; the step loop reads them on every step
        object.__setattr__(self, "_sublayers", list(self.parts.model.children()))

    @property
    def model(self) -> SubLayerModel:
        """The whole model."""
        return self.parts.model

    @property
    def sublayers(self) -> list[nn.Module]:
        """The model's sub-layers, in order."""
        return self._sublayers

    def stage_sublayers(self, lo: int, hi: int) -> list[nn.Module]:
        """Sub-layers ``lo:hi`` as a stage runs them: compiled wrappers when compilation is on."""
        return (self.compiled or self.sublayers)[lo:hi]

    @property
    def unit_ends(self) -> tuple[int, ...]:
        """Where each freezable unit ends (sub-layer index, exclusive)."""
        return tuple(self.parts.model.unit_ends)

    @property
    def track_gradients(self) -> bool:
        """Whether the policy reads gradient statistics (then steps accumulate them and decisions gather them)."""
        return bool(self.parts.policy.needs_stats)

    def epochs_left(self, step: int | None) -> float | None:
        """The run's epochs left after ``step`` optimizer steps, a fraction inside an epoch (``None``: not known)."""
        if step is None:
            return None
        per_epoch = self.epoch.steps
        return (self.config.train.run_steps(per_epoch) - step) / per_epoch

    def plan(self, layout: Layout) -> RankPlan:
        """The rank plan of ``layout``'s pipeline length."""
        return self.groups.plan(layout.pipe_len)

    def owned(self, layout: Layout) -> range | tuple[int, ...]:
        """The sub-layers this rank's stages train in ``layout``."""
        return owned_sublayers(layout, self.plan(layout), self.rank)

    def held(self, layout: Layout) -> tuple[int, ...]:
        """The sub-layers this rank keeps in memory in ``layout`` (its stage's, and the frozen prefix on stage 0)."""
        return held_sublayers(layout, self.plan(layout), self.rank)

    def broadcast_bytes(self, payload: bytes | None, src: int) -> bytes:
        """Broadcast bytes from ``src`` over the gloo control group (a collective)."""
        return self.groups.broadcast_bytes(payload, src=src)

    def autocast(self) -> torch.autocast:
        """The autocast context the forward passes run in."""
        return self.autocast_for(self.config, self.device)()

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the forward passes autocast to (``None``: no autocast)."""
        return self.autocast_dtype_for(self.config)

    @staticmethod
    def autocast_dtype_for(config: TrainConfig) -> torch.dtype | None:
        """The dtype ``config``'s forward passes autocast to (``None``: no autocast)."""
        return torch.bfloat16 if config.train.autocast == "bf16" else None

    @staticmethod
    def autocast_for(config: TrainConfig, device: torch.device) -> Callable[[], torch.autocast]:
        """A function returning the autocast context ``config`` asks for on ``device``."""
        dtype = RunContext.autocast_dtype_for(config)
        return lambda: torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def run_sublayers(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Sub-layers ``lo:hi`` on ``x`` without gradients (the frozen prefix's forward)."""
        sublayers = self.sublayers
        with torch.no_grad(), self.autocast():
            for j in range(lo, hi):
                x = sublayers[j](x)
        return x

    def prefix_example(self, frozen: int) -> torch.Tensor:
        """An example output of the frozen sub-layers ``0:frozen`` for one sample (its shape and dtype count)."""
        return self.examples[frozen]

    def restore_modes(self, layout: Layout | None, training: bool) -> None:
        """Back to ``training`` mode, except the frozen prefix, which always runs in eval mode (no dropout)."""
        self.model.train(training)
        if layout is not None:
            for m in self.sublayers[: layout.frozen]:
                m.eval()
