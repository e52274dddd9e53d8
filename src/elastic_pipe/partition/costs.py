"""Cost models: what each layer weighs for a solver.

Two sources of :class:`~elastic_pipe.types.LayerCost` records feed the solvers:

* measured ones, from :func:`elastic_pipe.partition.profile_layers`;
* the analytic transformer model here, at the published sub-layer granularity (attention with its residual, MLP
  with its residual), from a :class:`~elastic_pipe.types.TransformerShape` (the catalogued presets are
  :func:`elastic_pipe.models.model_shape`): parameters, forward/backward time from FLOPs at a given device
  throughput, output activation bytes, and training memory (parameters, gradients, optimizer state and the
  activations stored for backward for one micro-batch).

:func:`weights_from_costs` turns records into the plain per-layer numbers the solvers take, pricing frozen layers
by their measured frozen cost when known, else by a frozen-cost factor (1/6 as published).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from elastic_pipe.partition.errors import CHECK, PartitionError
from elastic_pipe.partition.greedy import DEFAULT_FROZEN_FACTOR
from elastic_pipe.types import BACKWARD_TO_FORWARD, MAX_BYTES, LayerCost, TransformerShape

__all__ = [
    "METRICS",
    "TrainingPrecision",
    "TransformerShape",
    "training_memory_bytes",
    "transformer_costs",
    "weights_from_costs",
]

#: The metrics :func:`weights_from_costs` knows.
METRICS = ("time", "params", "memory")
#: The most bytes a number takes in :class:`TrainingPrecision` (a float64 Adam state is 16): a larger value is a
#: mistake, not a format.
MAX_ELEMENT_BYTES = 1024
#: The most samples a micro-batch holds in :func:`transformer_costs` (beyond any device's memory).
MAX_MICRO_BATCH = 2**31

#: FLOPs of a multiply-add.
_FLOPS_PER_MAC = 2
#: Stored activations per token and hidden unit, in bytes at 16-bit precision with dropout masks, from
#: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022): attention 11 sbh +
#: 5 a s^2 b, MLP 19 sbh, each layer norm 2 sbh. Here each sub-layer carries its own layer norm.
_ATTENTION_ACT_PER_TOKEN_HIDDEN = 11 + 2
_ATTENTION_ACT_PER_SCORE = 5
_MLP_ACT_PER_TOKEN_HIDDEN = 19 + 2
#: The formula above is for 2-byte activations.
_FORMULA_BYTES = 2


def weights_from_costs(
    costs: Sequence[LayerCost],
    metric: str = "time",
    frozen: int = 0,
    frozen_factor: float = DEFAULT_FROZEN_FACTOR,
) -> list[float]:
    """Per-layer weights for a solver.

    Args:
        costs: one record per layer, in model order.
        metric: ``"time"`` (forward + backward seconds), ``"params"`` (parameter count) or ``"memory"``
            (training bytes).
        frozen: number of frozen leading layers.
        frozen_factor: a frozen layer's weight relative to its active weight when its frozen cost was not
            measured (``frozen_forward`` for time, ``frozen_memory_bytes`` for memory; params always use it).

    Returns:
        One float per layer.

    Raises:
        PartitionError: on an unknown metric, ``frozen`` outside ``0..len(costs)`` or ``frozen_factor`` outside
            ``[0, 1]``.
    """
    for index, cost in enumerate(CHECK.items("costs", costs)):
        CHECK.instance(f"costs[{index}]", cost, LayerCost)
    CHECK.number("frozen_factor", frozen_factor)
    if CHECK.str("metric", metric) not in METRICS:
        raise PartitionError(f"unknown metric {metric!r}; valid metrics: {', '.join(METRICS)}")
    CHECK.int("frozen", frozen)
    if isinstance(frozen, bool) or not isinstance(frozen, int) or not 0 <= frozen <= len(costs):
        raise PartitionError(f"frozen must be an int in 0..{len(costs)} (the number of layers), got {frozen!r}")
    if not (math.isfinite(frozen_factor) and 0.0 <= frozen_factor <= 1.0):
        raise PartitionError(f"frozen_factor must be in [0, 1], got {frozen_factor!r}")
    weights: list[float] = []
    for index, cost in enumerate(costs):
        is_frozen = index < frozen
        if metric == "time":
            active = cost.train_time
            measured = cost.frozen_forward
        elif metric == "params":
            active, measured = float(cost.params), None
        else:
            active = float(cost.memory_bytes)
            measured = None if cost.frozen_memory_bytes is None else float(cost.frozen_memory_bytes)
        if not is_frozen:
            weights.append(float(active))
        elif measured is not None:
            weights.append(float(measured))
        else:
            weights.append(float(active) * frozen_factor)
    return weights


@dataclass(frozen=True, slots=True)
class TrainingPrecision:
    """Bytes per value in training.

    Attributes:
        param_bytes: bytes per parameter (4: fp32 master weights).
        grad_bytes: bytes per gradient.
        optimizer_bytes: optimizer state per parameter (8: Adam's two fp32 moments).
        activation_bytes: bytes per activation value (2: bf16/fp16 autocast).
    """

    param_bytes: int = 4
    grad_bytes: int = 4
    optimizer_bytes: int = 8
    activation_bytes: int = 2

    def __post_init__(self) -> None:
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes"):
            value = getattr(self, key)
            CHECK.int(f"TrainingPrecision.{key}", value, hi=MAX_ELEMENT_BYTES)


def training_memory_bytes(params: int, stored_activation_bytes: int, precision: TrainingPrecision) -> int:
    """Memory one active layer holds in training: parameters, gradients, optimizer state, stored activations."""
    CHECK.int("params", params, hi=MAX_BYTES)
    CHECK.int("stored_activation_bytes", stored_activation_bytes, hi=MAX_BYTES)
    CHECK.instance("precision", precision, TrainingPrecision)
    per_param = precision.param_bytes + precision.grad_bytes + precision.optimizer_bytes
    return params * per_param + stored_activation_bytes


def transformer_costs(
    shape: TransformerShape,
    micro_batch: int,
    *,
    flops_per_second: float,
    precision: TrainingPrecision | None = None,
) -> list[LayerCost]:
    """Analytic per-sub-layer costs of a transformer stack.

    The list is ``[embed] + [block{i}.attn, block{i}.mlp for each block]`` (``embed`` only when
    ``shape.vocab > 0``: a ViT's patch embedding is left out). Times count the matrix multiplies only (at
    ``flops_per_second``), the backward :data:`~elastic_pipe.types.BACKWARD_TO_FORWARD` times the forward; this is
    a planning model, :func:`~elastic_pipe.partition.profile_layers` measures real ones.

    Args:
        shape: the stack's dimensions, e.g. ``elastic_pipe.models.model_shape("bert-large")``.
        micro_batch: samples per micro-batch b.
        flops_per_second: sustained device throughput used to turn FLOPs into seconds.
        precision: bytes per parameter, gradient, optimizer state and activation.

    Returns:
        One :class:`LayerCost` per sub-layer.
    """
    CHECK.instance("shape", shape, TransformerShape)
    CHECK.int("micro_batch", micro_batch, lo=1, hi=MAX_MICRO_BATCH)
    if precision is not None:
        CHECK.instance("precision", precision, TrainingPrecision)
    if not (math.isfinite(CHECK.number("flops_per_second", flops_per_second)) and flops_per_second > 0):
        raise PartitionError(f"flops_per_second must be a finite number > 0, got {flops_per_second!r}")
    prec = precision or TrainingPrecision()
    h, a, f, s, b = shape.hidden, shape.heads, shape.ffn, shape.seq_len, micro_batch
    tokens = b * s
    out_bytes = tokens * h * prec.activation_bytes
    act_scale = prec.activation_bytes / _FORMULA_BYTES
    norm_params = 2 * h

    def record(name: str, params: int, macs: int, stored: float) -> LayerCost:
        forward = _FLOPS_PER_MAC * macs / flops_per_second
        stored_bytes = round(stored * act_scale)
        return LayerCost(
            name=name,
            params=params,
            forward=forward,
            backward=BACKWARD_TO_FORWARD * forward,
            activation_bytes=out_bytes,
            memory_bytes=training_memory_bytes(params, stored_bytes, prec),
            frozen_forward=forward,
            frozen_memory_bytes=params * prec.param_bytes,
        )

    costs: list[LayerCost] = []
    if shape.vocab:
        # Token and position tables; a lookup does no multiplies, so its time is ~0 in this model.
        costs.append(record("embed", (shape.vocab + shape.positions) * h + norm_params, 0, 0))
    attn_params = 4 * h * h + 4 * h + norm_params
    attn_macs = 4 * tokens * h * h + 2 * b * s * s * h
    attn_stored = _ATTENTION_ACT_PER_TOKEN_HIDDEN * tokens * h + _ATTENTION_ACT_PER_SCORE * a * s * s * b
    mlp_params = 2 * h * f + f + h + norm_params
    mlp_macs = 2 * tokens * h * f
    mlp_stored = _MLP_ACT_PER_TOKEN_HIDDEN * tokens * h
    for block in range(shape.blocks):
        costs.append(record(f"block{block}.attn", attn_params, attn_macs, attn_stored))
        costs.append(record(f"block{block}.mlp", mlp_params, mlp_macs, mlp_stored))
    return costs
