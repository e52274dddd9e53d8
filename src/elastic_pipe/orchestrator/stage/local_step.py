"""The runner of a one-stage, one-micro-batch layout (:class:`LocalStep`), and the compilation seconds it counts
(as torch measured them, :func:`~elastic_pipe.orchestrator.compilation.compile_seconds`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from elastic_pipe.orchestrator.compilation import compile_seconds

__all__: list[str] = []  # internal: the package face exports what others use


class LocalStep:
    """The runner of a one-stage, one-micro-batch layout: forward, loss and backward, called directly.

    With one stage there is nothing to send and with one micro-batch nothing to schedule, so this is what torch's
    one-stage schedules compute (the same loss and gradients: ``tests/test_orchestrator_units.py`` compares them),
    without their per-step bookkeeping, which dominates a step whose layers are nearly all frozen.

    Args:
        module: the stage.
        loss_fn: ``loss_fn(output, target)``.
        compiled: the stage is built from compiled sub-layers: the seconds spent compiling inside steps
            accumulate in :attr:`compile_s`.
        grad_input: the input always carries a gradient (a detached copy that requires one). Set for a compiled
            stage that does not start at the model's input: dynamo guards on ``requires_grad``, so without this
            the first sub-layer of every stage behind the frozen prefix would compile a second variant of code its
            class already has (1.4 s for a ViT-B block and 2.6 s for its head on one H200, measured), against the
            input gradient it computes and drops (one matrix product of the block's first layer).
    """

    def __init__(
        self,
        module: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        compiled: bool = False,
        grad_input: bool = False,
    ) -> None:
        self.module = module
        self.loss_fn = loss_fn
        self.compiled = compiled
        self.grad_input = grad_input
        self.compile_s = 0.0

    def step(self, x: torch.Tensor, *, target: torch.Tensor, losses: list[torch.Tensor] | None = None) -> None:
        """One training step's forward and backward (gradients accumulate into ``.grad``)."""
        before = compile_seconds() if self.compiled else 0.0
        if self.grad_input and not x.requires_grad and x.is_floating_point():
            x = x.detach().requires_grad_(True)
        loss = self.loss_fn(self.module(x), target)
        torch.autograd.backward(loss)  # what loss.backward() calls (typed; Tensor.backward is not)
        if self.compiled:
            self.compile_s += compile_seconds() - before
        if losses is not None:
            losses.append(loss.detach())
