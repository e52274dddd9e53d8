"""The cost model against measured runs.

* :func:`h200_calibration`: REFERENCE.md section 7's ViT-B/16 numbers on the lent 2x H200 machine, predicted with
  the default :class:`~elastic_pipe.planner.GpuSpec` and :class:`~elastic_pipe.planner.ClusterSpec`; the tests hold
  every row within :data:`CALIBRATION_TOLERANCE` (or within 1% of a full step for near-zero ratios).
* :func:`cpu_calibration`: profile a small model on the CPU, predict its step, run it and time it.

docs/planner.md prints both tables.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from elastic_pipe.freeze import AlphaSchedule, frozen_by_epoch
from elastic_pipe.partition import profile_layers
from elastic_pipe.planner.cluster import ClusterSpec, GpuSpec
from elastic_pipe.planner.costs import SubLayerCost, from_layer_costs, price
from elastic_pipe.planner.models import model_config, model_work
from elastic_pipe.planner.step import Mode, predict_step
from elastic_pipe.types import LayerCost

__all__ = [
    "CALIBRATION_TOLERANCE",
    "CalibrationRow",
    "cpu_calibration",
    "cpu_model",
    "h200_calibration",
    "relative_step_cost",
]

#: The issue's target: measured quantities predicted within 15%.
CALIBRATION_TOLERANCE = 0.15
#: Global batch of the one-GPU measurements.
ONE_GPU_BATCH = 256
#: Global batch of the two-GPU measurements.
TWO_GPU_BATCH = 512
#: Micro-batches of the measured best two-stage pipeline.
MEASURED_PIPELINE_MICROBATCHES = 8
#: Blocks frozen in the measured two-GPU DDP runs with a frozen prefix.
MEASURED_DDP_FROZEN = 6
#: Measured relative step costs with N of 12 blocks frozen: N -> (recompute, cached).
MEASURED_RELATIVE = {3: (0.81, 0.73), 6: (0.64, 0.49), 9: (0.48, 0.25), 12: (0.32, 0.02)}


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One measured quantity and its prediction.

    Attributes:
        name: what was measured.
        unit: its unit.
        measured: the measured value.
        predicted: the cost model's value.
    """

    name: str
    unit: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """Relative error of the prediction, ``predicted / measured - 1``."""
        return self.predicted / self.measured - 1.0


def _modes(costs: Sequence[SubLayerCost], frozen: int, cached: bool) -> list[tuple[SubLayerCost, Mode]]:
    out = []
    for c in costs:
        if c.unit is not None and c.unit < frozen:
            out.append((c, Mode.CACHED if cached else Mode.FROZEN))
        else:
            out.append((c, Mode.ACTIVE))
    return out


def _boundary_bytes(costs: Sequence[SubLayerCost], frozen: int) -> float:
    last = [c for c in costs if c.unit is not None and c.unit < frozen]
    return last[-1].output_bytes if last else 0.0


def _step(
    costs: Sequence[SubLayerCost],
    cluster: ClusterSpec,
    *,
    batch: int,
    frozen: int = 0,
    cached: bool = False,
    pipe_len: int = 1,
    microbatches: int = 1,
) -> float:
    read = _boundary_bytes(costs, frozen) / cluster.gpu_cache_bandwidth if cached else 0.0
    return predict_step(
        _modes(costs, frozen, cached),
        cluster,
        global_batch=batch,
        pipe_len=pipe_len,
        microbatches=microbatches,
        cache_seconds_per_sample=read,
    ).step_time


def relative_step_cost(costs: Sequence[SubLayerCost], cluster: ClusterSpec, frozen: int, *, cached: bool) -> float:
    """One-GPU step time with ``frozen`` units frozen (recomputed or read from a GPU cache) over the full step."""
    full = _step(costs, cluster, batch=ONE_GPU_BATCH)
    return _step(costs, cluster, batch=ONE_GPU_BATCH, frozen=frozen, cached=cached) / full


def h200_calibration(one: ClusterSpec | None = None, two: ClusterSpec | None = None) -> list[CalibrationRow]:
    """Predict REFERENCE.md section 7's ViT-B/16 measurements; defaults: 1 and 2 H200s on one node."""
    one = one or ClusterSpec(1)
    two = two or ClusterSpec(2)
    costs = price(model_work(model_config("vit-b16")), one.gpu)
    rows = [
        CalibrationRow("one GPU, batch 256: training step", "ms", 92.5, 1e3 * _step(costs, one, batch=ONE_GPU_BATCH)),
        CalibrationRow(
            "one GPU, batch 256: peak memory",
            "GiB",
            17.6,
            predict_step(
                _modes(costs, 0, False), one, global_batch=ONE_GPU_BATCH, pipe_len=1, microbatches=1
            ).stage_memory[0]
            / 2**30,
        ),
    ]
    for n, (recompute, cached) in MEASURED_RELATIVE.items():
        rows.append(
            CalibrationRow(
                f"relative step, {n} frozen, recomputed",
                "x",
                recompute,
                relative_step_cost(costs, one, n, cached=False),
            )
        )
        rows.append(
            CalibrationRow(
                f"relative step, {n} frozen, GPU cache", "x", cached, relative_step_cost(costs, one, n, cached=True)
            )
        )
    schedule = frozen_by_epoch(AlphaSchedule(12, 1 / 3), 10)
    mean_recompute = math.fsum(relative_step_cost(costs, one, f, cached=False) for f in schedule) / len(schedule)
    mean_cached = math.fsum(relative_step_cost(costs, one, f, cached=True) for f in schedule) / len(schedule)
    rows += [
        CalibrationRow("alpha=1/3, 10 epochs: mean step, recomputed", "x", 0.50, mean_recompute),
        CalibrationRow("alpha=1/3, 10 epochs: mean step, cached", "x", 0.28, mean_cached),
        CalibrationRow("alpha=1/3, 10 epochs: ideal speedup with cache", "x", 3.6, 1.0 / mean_cached),
        CalibrationRow(
            "two GPUs, batch 512: DDP", "samples/s", 5332, TWO_GPU_BATCH / _step(costs, two, batch=TWO_GPU_BATCH)
        ),
        CalibrationRow(
            "two GPUs, batch 512: 1F1B, 2 stages, 8 micro-batches",
            "samples/s",
            4256,
            TWO_GPU_BATCH
            / _step(costs, two, batch=TWO_GPU_BATCH, pipe_len=2, microbatches=MEASURED_PIPELINE_MICROBATCHES),
        ),
        CalibrationRow(
            "two GPUs, batch 512: DDP, 6 frozen, recomputed",
            "samples/s",
            8310,
            TWO_GPU_BATCH / _step(costs, two, batch=TWO_GPU_BATCH, frozen=MEASURED_DDP_FROZEN),
        ),
        CalibrationRow(
            "two GPUs, batch 512: DDP, 6 frozen, GPU cache",
            "samples/s",
            11256,
            TWO_GPU_BATCH / _step(costs, two, batch=TWO_GPU_BATCH, frozen=MEASURED_DDP_FROZEN, cached=True),
        ),
    ]
    return rows


#: CPU calibration model: input features, classes, MLP expansion.
CPU_INPUT_FEATURES = 64
CPU_CLASSES = 10
CPU_MLP_EXPANSION = 4


class _Residual(torch.nn.Module):
    """A pre-norm residual MLP sub-layer (the shape of a transformer's MLP sub-layer)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.LayerNorm(width),
            torch.nn.Linear(width, CPU_MLP_EXPANSION * width),
            torch.nn.GELU(),
            torch.nn.Linear(CPU_MLP_EXPANSION * width, width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.body(x)
        return out


def cpu_model(blocks: int, width: int, *, seed: int = 0) -> list[tuple[str, torch.nn.Module]]:
    """The small model the CPU calibration profiles and runs: embedding, ``blocks`` residual MLPs, head."""
    torch.manual_seed(seed)
    layers: list[tuple[str, torch.nn.Module]] = [("embed", torch.nn.Linear(CPU_INPUT_FEATURES, width))]
    layers += [(f"block{i}", _Residual(width)) for i in range(blocks)]
    layers.append(("head", torch.nn.Linear(width, CPU_CLASSES)))
    return layers


def _measure_step(
    layers: Sequence[tuple[str, torch.nn.Module]], x: torch.Tensor, frozen_layers: int, repeats: int
) -> float:
    """Fastest forward + loss + backward with the first ``frozen_layers`` layers frozen (no_grad), in seconds.

    Timed with this thread's CPU clock (torch runs single-threaded here, so that is its compute time) and the
    fastest run kept: on a shared machine a whole step is likelier to be preempted than the short per-layer runs
    the profiler times, and neither the preemption nor other processes' work should count.
    """
    modules = [m for _, m in layers]
    for i, m in enumerate(modules):
        m.requires_grad_(i >= frozen_layers)
    target = torch.zeros(x.shape[0], dtype=torch.long)
    times = []
    for _ in range(repeats + 2):
        start = time.thread_time()
        h = x
        with torch.no_grad():
            for m in modules[:frozen_layers]:
                h = m(h)
        for m in modules[frozen_layers:]:
            h = m(h)
        loss = torch.nn.functional.cross_entropy(h, target)
        torch.autograd.backward(loss)
        times.append(time.thread_time() - start)
        for m in modules:
            m.zero_grad(set_to_none=True)
    for m in modules:
        m.requires_grad_(True)
    return min(times[2:])


def _median_profile(rounds: Sequence[Sequence[LayerCost]]) -> list[LayerCost]:
    """Per layer, the median of several profiling rounds: one disturbed round cannot move it, and unlike the
    fastest round it does not add up every layer's luckiest run (sizes are the same in every round)."""
    out = []
    for versions in zip(*rounds, strict=True):
        frozen = [v.frozen_forward for v in versions if v.frozen_forward is not None]
        out.append(
            replace(
                versions[0],
                forward=statistics.median(v.forward for v in versions),
                backward=statistics.median(v.backward for v in versions),
                frozen_forward=statistics.median(frozen) if frozen else None,
            )
        )
    return out


def cpu_calibration(
    *,
    blocks: int = 6,
    width: int = 256,
    batch: int = 64,
    frozen: Sequence[int] = (0, 3),
    repeats: int = 7,
    rounds: int = 3,
) -> list[CalibrationRow]:
    """Profile a small model on the CPU, predict its step with ``frozen`` leading units, and measure it.

    The per-layer costs come from :func:`elastic_pipe.partition.profile_layers`, run ``rounds`` times with the
    median round kept per layer (one profile is still hit when other work holds the core for a while); the
    step is timed on this thread's CPU clock, fastest of ``repeats``; the prediction is the planner's
    one-device step (compute only: the measured step runs no optimizer). Unit 0 is the embedding with the first
    block, as in the package's models. Runs single-threaded and restores the thread count.

    Returns:
        One row per frozen count, times in milliseconds.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # profile and run alike; several threads on a shared machine only add noise
    try:
        layers = cpu_model(blocks, width)
        x = torch.randn(batch, CPU_INPUT_FEATURES, generator=torch.Generator().manual_seed(1))
        records = _median_profile([profile_layers(layers, x, repeats=repeats, warmup=2) for _ in range(rounds)])
        costs = from_layer_costs(records, batch, unit_ends=list(range(2, blocks + 2)))
        cluster = ClusterSpec(1, gpu=GpuSpec(name="cpu", host_overhead=0.0))
        rows = []
        for f in frozen:
            step = predict_step(_modes(costs, f, cached=False), cluster, global_batch=batch, pipe_len=1, microbatches=1)
            measured = _measure_step(layers, x, f + 1 if f else 0, repeats)
            name = f"CPU, {blocks} blocks x {width}, batch {batch}, {f} frozen units"
            rows.append(CalibrationRow(name, "ms", 1e3 * measured, 1e3 * step.breakdown.compute))
    finally:
        torch.set_num_threads(threads)
    return rows
