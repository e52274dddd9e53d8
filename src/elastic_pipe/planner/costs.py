"""Per-sample sub-layer costs on a given GPU, from analytic work counts or from measured layer costs.

Times are GPU seconds per sample; a micro-batch of ``b`` samples costs ``b`` times as much (the model ignores the
lower efficiency of very small kernels; the per-micro-batch host overhead, which dominates there, is modelled
separately). The backward factors below were fitted on ViT-B/16's sub-layers timed on one H200 (bf16 autocast,
eager); each factor gives the timings it rests on, and docs/planner.md ("The cost model") describes the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from elastic_pipe.planner.cluster import GpuSpec
from elastic_pipe.planner.errors import CHECK, PlannerError
from elastic_pipe.planner.models import HOST_WEIGHT_PER_SUBLAYER, SubLayerWork
from elastic_pipe.types import BACKWARD_TO_FORWARD, MAX_BYTES, LayerCost

__all__ = [
    "FROZEN_BYTES_PER_PARAM",
    "GRAD_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "STATE_BYTES_PER_PARAM",
    "SubLayerCost",
    "from_layer_costs",
    "price",
    "to_layer_costs",
]

#: Backward of a matrix multiply: input gradient plus weight gradient, each as large as the forward.
MATMUL_BACKWARD_FACTOR = BACKWARD_TO_FORWARD
#: Backward of the fused attention core relative to its forward. Fitted: ViT-B/16's attention sub-layer measures
#: 0.97 ms forward and 3.70 ms forward+backward at batch 256 on H200; the matmul and element-wise parts explain
#: all but ~1.25 ms of the backward, 5.4 times the core's forward.
ATTENTION_BACKWARD_FACTOR = 5.4
#: Backward of the patch-embedding convolution (weight gradient only: its input needs none). Measured: 1.44 ms
#: backward after 2.47 ms forward.
CONV_BACKWARD_FACTOR = 0.58
#: Element-wise kernels read the saved input and the output gradient and write the input gradient.
MEMORY_BACKWARD_FACTOR = 2.0
#: A block recomputed under ``no_grad`` runs slightly faster than its training forward (2.1 ms vs 2.2 ms measured).
FROZEN_FORWARD_FACTOR = 0.95
#: Training state per active parameter: fp32 weight, fp32 gradient, Adam's two fp32 moments.
STATE_BYTES_PER_PARAM = 16
#: A frozen parameter keeps only its fp32 weight.
FROZEN_BYTES_PER_PARAM = 4
#: Gradients are all-reduced in fp32.
GRAD_BYTES_PER_PARAM = 4
#: A fused Adam step reads weight, gradient and two moments and writes weight and moments, all fp32.
OPTIMIZER_BYTES_PER_PARAM = 7 * 4


@dataclass(frozen=True, slots=True)
class SubLayerCost:
    """What one sub-layer costs per sample on a given device.

    Attributes:
        name: sub-layer name.
        unit: freezable unit (``None``: never frozen, e.g. the head).
        params: parameter count.
        forward: GPU seconds per sample, training forward.
        backward: GPU seconds per sample, backward (input and weight gradients).
        frozen_forward: GPU seconds per sample when recomputed frozen under ``no_grad``.
        output_bytes: bytes per sample of the output.
        stored_bytes: bytes per sample kept for the backward pass.
        host_weight: eager host work, in blocks per pass and micro-batch.
    """

    name: str
    unit: int | None
    params: int
    forward: float
    backward: float
    frozen_forward: float
    output_bytes: float
    stored_bytes: float
    host_weight: float = HOST_WEIGHT_PER_SUBLAYER

    def __post_init__(self) -> None:
        values = {
            "params": self.params,
            "forward": self.forward,
            "backward": self.backward,
            "frozen_forward": self.frozen_forward,
            "output_bytes": self.output_bytes,
            "stored_bytes": self.stored_bytes,
            "host_weight": self.host_weight,
        }
        CHECK.str("SubLayerCost.name", self.name)
        CHECK.optional_int(f"SubLayerCost({self.name!r}).unit", self.unit)
        CHECK.int(f"SubLayerCost({self.name!r}).params", self.params, hi=MAX_BYTES)
        for key, value in values.items():
            if not CHECK.number(f"SubLayerCost({self.name!r}).{key}", value) >= 0 or value == float("inf"):
                raise PlannerError(f"SubLayerCost({self.name!r}).{key} must be a finite number >= 0, got {value!r}")
        if self.unit is not None and self.unit < 0:
            raise PlannerError(f"SubLayerCost({self.name!r}).unit must be >= 0 or None, got {self.unit!r}")


def check_costs(name: str, costs: object) -> None:
    """Raise :class:`PlannerError` unless ``costs`` is a non-empty sequence of :class:`SubLayerCost`."""
    for index, item in enumerate(CHECK.items(name, costs)):
        CHECK.instance(f"{name}[{index}]", item, SubLayerCost)


def price(work: Sequence[SubLayerWork], gpu: GpuSpec) -> tuple[SubLayerCost, ...]:
    """Turn analytic work counts into per-sample times on ``gpu``."""
    for index, item in enumerate(CHECK.items("work", work)):
        CHECK.instance(f"work[{index}]", item, SubLayerWork)
    CHECK.instance("gpu", gpu, GpuSpec)
    out = []
    for w in work:
        matmul = w.matmul_flops / gpu.matmul_flops
        core = w.attention_flops / gpu.attention_flops
        conv = w.conv_flops / gpu.conv_flops
        memory = w.memory_bytes / gpu.memory_bandwidth
        forward = matmul + core + conv + memory
        backward = (
            MATMUL_BACKWARD_FACTOR * matmul
            + ATTENTION_BACKWARD_FACTOR * core
            + CONV_BACKWARD_FACTOR * conv
            + MEMORY_BACKWARD_FACTOR * memory
        )
        out.append(
            SubLayerCost(
                name=w.name,
                unit=w.unit,
                params=w.params,
                forward=forward,
                backward=backward,
                frozen_forward=FROZEN_FORWARD_FACTOR * forward,
                output_bytes=w.output_bytes,
                stored_bytes=w.stored_bytes,
                host_weight=w.host_weight,
            )
        )
    return tuple(out)


def from_layer_costs(
    costs: Sequence[LayerCost],
    batch: int,
    unit_ends: Sequence[int] | None = None,
    *,
    host_weight: float = 0.0,
) -> tuple[SubLayerCost, ...]:
    """Per-sample costs from measured records (e.g. the profiler's) taken at micro-batch size ``batch``.

    Args:
        costs: one record per sub-layer, in model order, measured at ``batch`` samples per micro-batch.
        batch: the micro-batch size the records were measured at.
        unit_ends: freezable units as sub-layer end offsets (freezing ``k`` units freezes sub-layers
            ``[0, unit_ends[k-1])``); sub-layers after the last end are never frozen. Default: every sub-layer but
            the last is its own unit.
        host_weight: host overhead weight per sub-layer; 0 when the measured times already include host work
            (any CPU measurement, or a measurement that synchronised after every layer).

    Raises:
        PlannerError: empty records, ``batch < 1`` or unit ends that are not increasing offsets within the model.
    """
    for index, item in enumerate(CHECK.items("costs", costs)):
        CHECK.instance(f"costs[{index}]", item, LayerCost)
    CHECK.int("batch", batch, lo=1)
    if unit_ends is not None:
        CHECK.ints("unit_ends", unit_ends)
    CHECK.float("host_weight", host_weight)
    if not costs:
        raise PlannerError("from_layer_costs needs at least one layer cost")
    if batch < 1:
        raise PlannerError(f"batch must be >= 1, got {batch}")
    n = len(costs)
    ends = list(unit_ends) if unit_ends is not None else list(range(1, n))
    if any(b <= a for a, b in zip([0, *ends], ends, strict=False)) or (ends and ends[-1] > n):
        raise PlannerError(f"unit_ends must be strictly increasing offsets in 1..{n}, got {ends}")
    unit_of: list[int | None] = [None] * n
    start = 0
    for unit, end in enumerate(ends):
        for i in range(start, end):
            unit_of[i] = unit
        start = end
    out = []
    for c, owner in zip(costs, unit_of, strict=True):
        state = STATE_BYTES_PER_PARAM * c.params
        frozen = c.frozen_forward if c.frozen_forward is not None else FROZEN_FORWARD_FACTOR * c.forward
        out.append(
            SubLayerCost(
                name=c.name,
                unit=owner,
                params=c.params,
                forward=c.forward / batch,
                backward=c.backward / batch,
                frozen_forward=frozen / batch,
                output_bytes=c.activation_bytes / batch,
                stored_bytes=max(0.0, (c.memory_bytes - state) / batch),
                host_weight=host_weight,
            )
        )
    return tuple(out)


def to_layer_costs(costs: Sequence[SubLayerCost], micro_batch: float) -> list[LayerCost]:
    """The shared :class:`~elastic_pipe.types.LayerCost` records at a micro-batch size (what the profiler emits)."""
    check_costs("costs", costs)
    CHECK.float("micro_batch", micro_batch)
    return [
        LayerCost(
            name=c.name,
            params=c.params,
            forward=c.forward * micro_batch,
            backward=c.backward * micro_batch,
            activation_bytes=round(c.output_bytes * micro_batch),
            memory_bytes=round(STATE_BYTES_PER_PARAM * c.params + c.stored_bytes * micro_batch),
            frozen_forward=c.frozen_forward * micro_batch,
            frozen_memory_bytes=FROZEN_BYTES_PER_PARAM * c.params,
        )
        for c in costs
    ]
