"""The probe batch of a probe-driven policy: a fixed batch of training samples the callbacks run in eval mode.

By default it is the first :data:`~.controller.PROBE_SAMPLES` samples of the training set (indices ``0 .. n-1``, the
same on every rank whatever the sampler does), collated by the training loader's own ``collate_fn``; a callback
also takes a batch of its own (``probe=``). The forward that runs it is the model's call on the batch (a mapping's
entries as keyword arguments, label keys left out; the first element of a tuple; a tensor as it is) unless a
``probe_forward(model, batch)`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import torch
from torch import nn

from elastic_pipe.integrations.errors import IntegrationError

__all__ = []  # internal: the callbacks' shared helpers

#: ``(model, batch) -> anything``: runs the model on the probe batch.
ProbeForward: TypeAlias = Callable[[nn.Module, Any], object]

#: Keys of a mapping batch that the probe's forward leaves out (a loss needs no computing there).
LABEL_KEYS = frozenset({"labels", "label", "label_ids"})


def checked_probe_samples(n: object) -> int:
    """``n`` as the size of a callback's default probe batch: an integer >= 1, else an IntegrationError naming it."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise IntegrationError(f"FreezeCallback: probe_samples must be an integer >= 1, got {n!r}")
    return n


def first_samples(loader: Any, n: int) -> Any:
    """The first ``n`` samples of ``loader``'s dataset, collated by its ``collate_fn``.

    Raises:
        IntegrationError: the loader has no indexable dataset of known length (an iterable dataset: give a
            probe batch of your own).
    """
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise IntegrationError(
            f"the training loader's dataset ({type(dataset).__name__}) cannot be indexed; pass probe=<a batch> "
            "to the freeze callback"
        )
    count = min(n, len(dataset))
    if count < 1:
        raise IntegrationError("the training set is empty; the probe needs at least one sample")
    collate = getattr(loader, "collate_fn", None) or torch.utils.data.default_collate
    return collate([dataset[i] for i in range(count)])


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it moved to ``device`` (recursively; a mapping becomes a plain dict)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def default_forward(model: nn.Module, batch: Any) -> object:
    """Run ``model`` on ``batch``: a mapping's entries as keywords (labels left out), a tuple's or list's first
    element, anything else as the one argument."""
    if isinstance(batch, Mapping):
        return model(**{k: v for k, v in batch.items() if k not in LABEL_KEYS})
    if isinstance(batch, tuple | list):
        return model(batch[0])
    return model(batch)


def first_tensor(output: object) -> torch.Tensor | None:
    """A block's output tensor: the output itself, the first element of a tuple, or the first value of a mapping."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple | list) and output:
        return first_tensor(output[0])
    if isinstance(output, Mapping) and output:
        return first_tensor(next(iter(output.values())))
    return None


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s first parameter lives (CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
