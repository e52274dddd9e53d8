"""The optimizer and learning-rate schedule a run trains with, built from its configuration."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["lr_lambda", "make_optimizer"]


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (with momentum) or AdamW over the model's trainable parameters, as ``config.optimizer`` says.

    On a GPU, AdamW runs fused (one kernel per step for all parameters, instead of a dozen multi-tensor launches):
    the same update, less host work per step.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    c = config
    if c.optimizer == "sgd":
        return torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay, fused=fused or None)


def lr_lambda(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor per optimizer step: linear warm-up, then constant or cosine decay to zero."""
    warmup = config.warmup_steps
    cosine = config.lr_schedule == "cosine"

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
