"""Apply a freeze decision to modules and their optimizer without disturbing the active parameters' state.

Setting ``requires_grad = False`` alone is not enough: a parameter left in the optimizer keeps its moments and,
if its gradient is a zero tensor rather than ``None``, momentum and weight decay keep moving it. Here newly frozen
parameters leave the optimizer's param groups and their state is dropped (as composer's layer freezing does);
every other parameter's state - moments, step counts - is left exactly as it was, so training the active layers
continues as if the optimizer had never held the frozen ones.

Param groups are kept even when they become empty, because learning-rate schedulers address groups by position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from elastic_pipe.freeze.errors import CHECK

__all__ = ["freeze_modules"]


def freeze_modules(modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer | None) -> int:
    """Freeze every parameter of ``modules`` and remove it from ``optimizer``.

    Each parameter stops requiring grad and loses its ``.grad``; if an optimizer is given, it leaves the param
    groups and its optimizer state is deleted. Idempotent.

    Args:
        modules: the modules to freeze (e.g. the newly frozen layers ``layers[old:new]``).
        optimizer: the optimizer training them, or None.

    Returns:
        The number of parameter tensors removed from the optimizer's param groups; without an optimizer, the
        number of parameter tensors that stopped requiring grad.
    """
    if optimizer is not None:
        CHECK.instance("freeze_modules: optimizer", optimizer, torch.optim.Optimizer)
    params: dict[int, nn.Parameter] = {}
    for index, module in enumerate(CHECK.items("freeze_modules: modules", modules, empty=True)):
        for p in CHECK.instance(f"freeze_modules: modules[{index}]", module, nn.Module).parameters():
            params.setdefault(id(p), p)
    newly = 0
    for p in params.values():
        if p.requires_grad:
            newly += 1
        p.requires_grad_(False)
        p.grad = None
    if optimizer is None:
        return newly
    removed = 0
    for group in optimizer.param_groups:
        kept = [p for p in group["params"] if id(p) not in params]
        removed += len(group["params"]) - len(kept)
        group["params"] = kept
    for p in params.values():
        optimizer.state.pop(p, None)
    return removed
