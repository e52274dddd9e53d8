"""A toy model with parameter-free sub-layers that count what autograd saves in their forward, and a partition
solver that gives them stages of their own: what the frozen-aware stage tests
(``tests/test_training_frozen_stages.py``) train.

:func:`toy_model` (``[model] name = "frozen_toy:toy_model"``) is 7 sub-layers on the 8x8 digits::

    0 flatten   (no parameters)   unit 0
    1 squash    (no parameters)   unit 0
    2 lin0      Linear(64, 16)    unit 0
    3 tanh0     (no parameters)   unit 1
    4 lin1      Linear(16, 16)    unit 1
    5 tanh1     (no parameters)   head
    6 head      Linear(16, 10)    head

:func:`leading_singles` (``[pipeline] solver = "frozen_toy:leading_singles"``) puts one sub-layer on each stage
but the last, which takes the rest. Over 2 stages the first holds ``flatten`` alone (no parameters, and an input
that needs no gradient), and after unit 0 freezes ``tanh0`` alone (reading the frozen prefix); the second stage's
input then needs no gradient either. Over 4 stages (2 ranks x 2 virtual stages) the second holds ``squash``, a
later stage whose upstream is parameter-free too, and after unit 0 freezes the third holds ``tanh1``: a stage with
no parameters whose input does need a gradient, which it must pass on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from elastic_pipe.models import SubLayerModel

#: Per parameter-free sub-layer, over the training-mode forwards of this process: ``[forwards, tensors autograd
#: saved for backward, outputs with a gradient history]``. Eval-mode forwards (the setup's boundary examples, the
#: frozen prefix, evaluation) are not counted.
RECORD: dict[str, list[int]] = {}


class Counted(nn.Module):
    """A parameter-free sub-layer ``fn`` that counts, in :data:`RECORD`, what autograd saved while it ran."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.name, self.fn = name, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``fn(x)``, counted."""
        if not self.training:
            return self.fn(x)
        saved = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = self.fn(x)
        counts = RECORD.setdefault(self.name, [0, 0, 0])
        counts[0] += 1
        counts[1] += saved
        counts[2] += out.grad_fn is not None
        return out


def toy_model(frozen: Sequence[str] = ()) -> SubLayerModel:
    """The toy model (the trainer seeds a builder given by import path), the parameters of the sub-layers named
    in ``frozen`` not requiring a gradient (frozen by the user, wherever the layout puts them)."""
    layers: list[tuple[str, nn.Module]] = [
        ("flatten", Counted("flatten", lambda x: x.flatten(1))),
        ("squash", Counted("squash", torch.tanh)),
        ("lin0", nn.Linear(64, 16)),
        ("tanh0", Counted("tanh0", torch.tanh)),
        ("lin1", nn.Linear(16, 16)),
        ("tanh1", Counted("tanh1", torch.tanh)),
        ("head", nn.Linear(16, 10)),
    ]
    for name, layer in layers:
        if name in frozen:
            layer.requires_grad_(False)
    return SubLayerModel(layers, (3, 5))


def leading_singles(costs: Sequence[float], stages: int, /, **options: Any) -> tuple[int, ...]:
    """One sub-layer on each stage but the last, which holds the rest (a partition solver)."""
    del options
    return (1,) * (stages - 1) + (len(costs) - stages + 1,)
