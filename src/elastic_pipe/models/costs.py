"""Analytic per-sub-layer costs as :class:`elastic_pipe.types.LayerCost` records.

One pass over an example batch gives, for each sub-layer, its parameter count, the size of its output (what
crosses a pipeline cut, and what the frozen-prefix cache stores per sample) and its forward FLOPs (counted by
``torch.utils.flop_counter``). Works on the meta device, so published-size models cost nothing to describe::

    with torch.device("meta"):
        model = vit("vit-b16")
        costs = sublayer_costs(model, torch.empty(1, 3, 224, 224), micro_batch=32)

Times are left at 0 unless ``flops_per_second`` is given; measured times come from the partition package's
profiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from elastic_pipe.models.errors import CHECK, ModelError, ModelTypeError
from elastic_pipe.models.layers import AttentionSubLayer
from elastic_pipe.types import BACKWARD_TO_FORWARD, MAX_DIMENSION, LayerCost

__all__ = [
    "ADAM_STATES",
    "SubLayerProfile",
    "analyze",
    "attention_flops",
    "sublayer_costs",
]

#: Optimizer tensors per parameter kept by Adam/AdamW (first and second moments).
ADAM_STATES = 2


@dataclass(frozen=True, slots=True)
class SubLayerProfile:
    """What one sub-layer holds and does for one sample.

    Attributes:
        name: sub-layer name, e.g. ``"block3.attn"``.
        params: parameter count.
        param_bytes: bytes of those parameters in their dtype.
        output_elements: elements of the output per sample.
        output_element_bytes: bytes per output element.
        forward_flops: forward FLOPs per sample (a multiply-add counts 2).
    """

    name: str
    params: int
    param_bytes: int
    output_elements: int
    output_element_bytes: int
    forward_flops: int


#: The most bytes an activation element takes, and the most optimizer tensors per parameter: larger values are
#: mistakes, not formats.
MAX_ELEMENT_BYTES = 1024


def attention_flops(tokens: int, dim: int) -> int:
    """Forward FLOPs per sample of one attention sub-layer: QKV and output projections plus the attention core.

    ``2*T*d*3d + 2*T*d*d`` for the projections and ``2*T*T*d`` each for ``QK^T`` and ``AV``. A causal kernel may
    skip the masked half of the core; the count here is the full square, as published FLOP counts use.
    """
    CHECK.int("tokens", tokens, hi=MAX_DIMENSION)
    CHECK.int("dim", dim, hi=MAX_DIMENSION)
    return 2 * tokens * dim * 4 * dim + 4 * tokens * tokens * dim


def _layers(model: nn.Module | Sequence[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    names = getattr(model, "layer_names", None)
    if isinstance(model, nn.Sequential):
        modules = list(model)
        labels = list(names) if names is not None else [str(i) for i in range(len(modules))]
        return list(zip(labels, modules, strict=True))
    if isinstance(model, nn.Module):
        raise ModelError(f"expected a SubLayerModel, an nn.Sequential or (name, module) pairs, got {type(model)}")
    return list(model)


@torch.no_grad()
def analyze(model: nn.Module | Sequence[tuple[str, nn.Module]], example: torch.Tensor) -> list[SubLayerProfile]:
    """Run ``example`` through the sub-layers once and describe each one per sample.

    Args:
        model: a :class:`SubLayerModel`, any ``nn.Sequential``, or ``(name, module)`` pairs in order.
        example: an input batch (any batch size >= 1; on the meta device for a meta model).

    Raises:
        ModelError: for an empty batch or a sub-layer that does not return one tensor.
    """
    if not isinstance(model, nn.Module):
        for index, pair in enumerate(CHECK.items("model", model)):
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], nn.Module)):
                raise ModelTypeError(f"model[{index}] must be a (name, module) pair, got {pair!r}")
    CHECK.instance("example", example, torch.Tensor)
    batch = int(example.shape[0]) if example.dim() else 0
    if batch < 1:
        raise ModelError(f"example must be a batch with at least one sample, got shape {tuple(example.shape)}")
    profiles = []
    h = example
    for name, module in _layers(model):
        tokens = int(h.shape[1]) if h.dim() >= 2 else 1
        with FlopCounterMode(display=False) as counter:
            h = module(h)
        if not isinstance(h, torch.Tensor):
            raise ModelError(f"sub-layer {name!r} returned {type(h).__name__}, expected one tensor")
        flops = int(counter.get_total_flops()) // batch
        if isinstance(module, AttentionSubLayer):
            # The counter sees every fused attention kernel differently per backend (the CPU one not at all), so
            # attention sub-layers are counted by formula: projections plus QK^T and AV over the full T x T.
            flops = attention_flops(tokens, module.qkv.in_features)
        params = list(module.parameters())
        profiles.append(
            SubLayerProfile(
                name=name,
                params=sum(p.numel() for p in params),
                param_bytes=sum(p.numel() * p.element_size() for p in params),
                output_elements=h.numel() // batch,
                output_element_bytes=h.element_size(),
                forward_flops=flops,
            )
        )
    return profiles


def sublayer_costs(
    model: nn.Module | Sequence[tuple[str, nn.Module]],
    example: torch.Tensor,
    *,
    micro_batch: int = 1,
    activation_bytes_per_element: int | None = None,
    optimizer_states: int = ADAM_STATES,
    flops_per_second: float | None = None,
) -> list[LayerCost]:
    """Analytic :class:`LayerCost` records, one per sub-layer, for one micro-batch.

    Args:
        model: a :class:`SubLayerModel`, any ``nn.Sequential``, or ``(name, module)`` pairs in order.
        example: an input batch (the batch size does not matter; costs are scaled to ``micro_batch``).
        micro_batch: samples per micro-batch.
        activation_bytes_per_element: bytes per activation element (2 for bf16 training); default: the output
            dtype's size.
        optimizer_states: optimizer tensors per parameter (2 for Adam, 1 for SGD with momentum, 0 for plain SGD).
        flops_per_second: sustained device FLOP/s; when given, ``forward`` = FLOPs / rate and ``backward`` =
            :data:`elastic_pipe.types.BACKWARD_TO_FORWARD` times that; otherwise both stay 0.

    Returns:
        ``LayerCost`` with ``params``, ``activation_bytes`` (the output of one micro-batch), ``memory_bytes``
        (parameters, gradients and optimizer state, plus the output activation of one micro-batch: a lower bound
        on what training holds) and, with ``flops_per_second``, ``forward`` / ``backward``.

    Raises:
        ModelError: for ``micro_batch < 1``, negative ``optimizer_states`` or a non-positive rate.
    """
    CHECK.int("micro_batch", micro_batch, lo=1, hi=MAX_DIMENSION)
    CHECK.optional_int("activation_bytes_per_element", activation_bytes_per_element, hi=MAX_ELEMENT_BYTES)
    CHECK.int("optimizer_states", optimizer_states, hi=MAX_ELEMENT_BYTES)
    CHECK.optional_float("flops_per_second", flops_per_second)
    if micro_batch < 1:
        raise ModelError(f"micro_batch must be >= 1, got {micro_batch!r}")
    if optimizer_states < 0:
        raise ModelError(f"optimizer_states must be >= 0, got {optimizer_states!r}")
    if flops_per_second is not None and not flops_per_second > 0:
        raise ModelError(f"flops_per_second must be > 0, got {flops_per_second!r}")
    costs = []
    for p in analyze(model, example):
        element = activation_bytes_per_element or p.output_element_bytes
        activation = p.output_elements * element * micro_batch
        forward = 0.0 if flops_per_second is None else p.forward_flops * micro_batch / flops_per_second
        costs.append(
            LayerCost(
                name=p.name,
                params=p.params,
                forward=forward,
                backward=BACKWARD_TO_FORWARD * forward,
                activation_bytes=activation,
                # weights + gradients (+ optimizer state), each the parameter's size
                memory_bytes=p.param_bytes * (2 + optimizer_states) + activation,
            )
        )
    return costs
