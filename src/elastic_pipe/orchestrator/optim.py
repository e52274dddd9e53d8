"""The optimizer and learning-rate schedule a run trains with.

The trainer takes an :data:`OptimizerFactory` (any ``params -> Optimizer`` callable, e.g.
``lambda params: torch.optim.AdamW(params, lr=3e-4)``); :func:`optimizer_factory` builds the one a config names.
The learning-rate schedule always comes from the config's numbers (warm-up, constant or cosine), counting
optimizer steps, so it does not depend on the layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig, TrainSection

__all__ = ["OptimizerFactory", "can_fuse", "lr_lambda", "lr_scheduler", "optimizer_factory"]

#: Builds an optimizer over a list of trainable parameters.
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def optimizer_factory(config: TrainConfig) -> OptimizerFactory:
    """SGD (with momentum) or AdamW, as ``[train] optimizer`` says.

    On a GPU, AdamW runs fused (one kernel per step for all parameters, instead of a dozen multi-tensor launches):
    the same update, less host work per step.
    """
    c = config.train

    def build(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        if c.optimizer == "sgd":
            return torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
        return torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay, fused=can_fuse(params) or None)

    return build


def can_fuse(params: list[nn.Parameter]) -> bool:
    """Whether AdamW can run fused over ``params``: some, and every one a floating-point tensor on a GPU."""
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


def lr_lambda(train: TrainSection, total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor per optimizer step: linear warm-up, then constant or cosine decay to zero."""
    warmup = train.warmup_steps
    cosine = train.lr_schedule == "cosine"

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def lr_scheduler(optimizer: torch.optim.Optimizer, train: TrainSection, steps_per_epoch: int) -> LambdaLR:
    """The run's learning-rate schedule (:func:`lr_lambda`) over its optimizer steps
    (:meth:`~.config.TrainSection.run_steps`)."""
    return LambdaLR(optimizer, lr_lambda(train, train.run_steps(steps_per_epoch)))
