"""An epoch's losses: kept on the device while its steps run, reduced to global losses where they come back to the
host, and checked for a non-finite value there (``[train] on_nonfinite``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe.orchestrator.errors import NonFiniteLossError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.stage import StageRuntime

__all__ = ["EpochLosses", "check_finite_losses", "step_loss"]


def step_loss(losses: list[torch.Tensor], none: torch.Tensor) -> torch.Tensor:
    """A step's loss to keep on the device: the mean of its micro-batch losses in float64 (``none``: no loss on
    this rank). One micro-batch's loss is kept as it is (no copy; :meth:`EpochLosses.global_losses` widens it to
    float64 exactly as the mean of one would)."""
    if len(losses) == 1:
        return losses[0].detach()
    return torch.stack([t.detach().double() for t in losses]).mean() if losses else none


@dataclass
class EpochLosses:
    """The current epoch's per-step losses: on the device while it runs (reading one would synchronise every
    step), plus the global losses of steps run before a mid-epoch checkpoint this run resumed from."""

    partial: list[float] = field(default_factory=list)
    local: list[torch.Tensor] = field(default_factory=list)

    def global_losses(self, stage: StageRuntime, device: torch.device) -> list[float]:
        """Global losses of the epoch's steps so far (a collective).

        Each step's loss lives on the last stage of each replica; the sum over the world divided by the replica
        count is the global loss.
        """
        if self.local:
            wide = [t.to(torch.float64) for t in self.local] if len({t.dtype for t in self.local}) > 1 else self.local
            mine = torch.stack(wide).to(torch.float64)
        else:
            mine = torch.zeros(0, dtype=torch.float64, device=device)
        if not stage.is_last:
            mine.zero_()
        dist.all_reduce(mine)
        return self.partial + (mine / stage.layout.replicas).tolist()

    def fold(self, stage: StageRuntime, device: torch.device) -> None:
        """Reduce the losses on the device into :attr:`partial` while ``stage``'s layout is current (a collective):
        before a transition inside the epoch, whose new layout puts the losses on other ranks."""
        self.partial, self.local = self.global_losses(stage, device), []


def check_finite_losses(losses: list[float], *, epoch: int, steps_before: int, steps_per_epoch: int) -> None:
    """Stop at the first NaN or infinite global loss among an epoch's steps so far (``[train] on_nonfinite``).

    Called where the losses already come back to the host - the epoch's end, and before a transition inside the
    epoch (:meth:`EpochLosses.fold`) - so the check adds no device-to-host synchronisation to any step; a non-finite
    step is found at the latest at its epoch's end, before that state is checkpointed or a decision made on it.
    The losses are global (the same on every rank), so every rank raises the same error.

    Args:
        losses: the epoch's global losses, from its first step on (0-based step ``j`` at ``losses[j]``).
        epoch: the epoch (0-based).
        steps_before: optimizer steps of the run before the epoch's first.
        steps_per_epoch: the epoch's steps.

    Raises:
        NonFiniteLossError: naming the epoch, the step in it and in the run, and the value.
    """
    for j, value in enumerate(losses):
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"training loss is {value} at epoch {epoch + 1}, step {j + 1} of {steps_per_epoch} (step "
                f"{steps_before + j + 1} of the run); the run stops (set train.on_nonfinite = 'continue' to train on)"
            )
