"""What one rank knows for the whole run, whatever the layout: its place in the job, the model, the data, the parts.

A :class:`RunContext` is built once by the trainer and handed to the parts that change with the layout
(:class:`~elastic_pipe.orchestrator.stage_runtime.StageRuntime`, the step loop, the transition executor,
evaluation). It holds no layout: everything layout-dependent takes a :class:`~elastic_pipe.types.Layout`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from elastic_pipe.groups import GroupManager
from elastic_pipe.orchestrator.components import Components
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.metrics import EventLog
from elastic_pipe.orchestrator.step_data import EpochPlan, StepData
from elastic_pipe.orchestrator.transition import owned_sublayers
from elastic_pipe.types import Layout

__all__ = ["RunContext"]


@dataclass
class RunContext:
    """One rank's fixed facts and shared helpers.

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
    #: The training split's sample ids on the host, where the cache looks them up: ids on a GPU would
    #: synchronise the host with the device at every cached step.
    host_ids: torch.Tensor = field(init=False)
    _prefix_memo: tuple[int, torch.Tensor] | None = field(default=None, init=False)
    _sublayers: list[nn.Module] = field(init=False)

    def __post_init__(self) -> None:
        self.host_ids = self.train_set.sample_ids.to("cpu", torch.int64)
        # the model's sub-layers never change during a run; the step loop reads them on every step
        self._sublayers = list(self.parts.model.children())

    @property
    def model(self) -> nn.Module:
        """The whole model (a SubLayerModel)."""
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
        return tuple(self.parts.model.unit_ends)  # type: ignore[arg-type]

    @property
    def track_gradients(self) -> bool:
        """Whether the policy reads gradient statistics (then steps accumulate them and decisions gather them)."""
        return bool(self.parts.policy.needs_stats)

    def plan(self, layout: Layout) -> Any:
        """The rank plan of ``layout``'s pipeline length."""
        return self.groups.plan(layout.pipe_len)

    def owned(self, layout: Layout) -> range:
        """The sub-layers this rank's stage holds in ``layout``."""
        return owned_sublayers(layout, self.plan(layout), self.rank)

    def broadcast_bytes(self, payload: bytes | None, src: int) -> bytes:
        """Broadcast bytes from ``src`` over the gloo control group (a collective)."""
        return self.groups.broadcast_bytes(payload, src=src)

    def autocast(self) -> Any:
        """The autocast context the forward passes run in."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.train.autocast == "bf16")

    def run_sublayers(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Sub-layers ``lo:hi`` on ``x`` without gradients (the frozen prefix's forward)."""
        sublayers = self.sublayers
        with torch.no_grad(), self.autocast():
            for j in range(lo, hi):
                x = sublayers[j](x)
        return x

    def prefix_example(self, frozen: int) -> torch.Tensor:
        """The output of the frozen sub-layers ``0:frozen`` on one training sample (eval mode).

        Memoised: frozen weights never change, so a later, larger boundary runs only the sub-layers frozen since.
        """
        memo = self._prefix_memo
        if memo is None or memo[0] > frozen:
            memo = (0, self.train_set.input_rows(0, 1).to(self.device))
        if memo[0] < frozen:
            memo = (frozen, self.run_sublayers(memo[1], memo[0], frozen))
        self._prefix_memo = memo
        return memo[1]

    def forget_prefix(self) -> None:
        """Drop the memoised prefix output (after loading weights it was not computed with)."""
        self._prefix_memo = None

    def restore_modes(self, layout: Layout | None, training: bool) -> None:
        """Back to ``training`` mode, except the frozen prefix, which always runs in eval mode (no dropout)."""
        self.model.train(training)
        if layout is not None:
            for m in self.sublayers[: layout.frozen]:
                m.eval()
