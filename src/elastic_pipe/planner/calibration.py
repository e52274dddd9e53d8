"""The cost model against measured runs: REFERENCE.md section 7's ViT-B/16 numbers on the lent 2x H200 machine.

:func:`h200_calibration` predicts each measured quantity with the default :class:`~elastic_pipe.planner.GpuSpec`
and :class:`~elastic_pipe.planner.ClusterSpec` (the H200 defaults) and returns prediction, measurement and relative
error side by side; docs/planner.md prints the table and the tests hold every row within
:data:`CALIBRATION_TOLERANCE`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from elastic_pipe.freeze import AlphaSchedule, frozen_by_epoch
from elastic_pipe.planner.cluster import ClusterSpec
from elastic_pipe.planner.costs import SubLayerCost, price
from elastic_pipe.planner.models import model_config, model_work
from elastic_pipe.planner.step import Mode, predict_step

__all__ = ["CALIBRATION_TOLERANCE", "CalibrationRow", "h200_calibration", "relative_step_cost"]

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
        CalibrationRow(
            "one GPU, batch 256: training step", "ms", 92.5, 1e3 * _step(costs, one, batch=ONE_GPU_BATCH)
        ),
        CalibrationRow(
            "one GPU, batch 256: peak memory",
            "GiB",
            17.6,
            predict_step(_modes(costs, 0, False), one, global_batch=ONE_GPU_BATCH, pipe_len=1, microbatches=1)
            .stage_memory[0]
            / 2**30,
        ),
    ]
    for n, (recompute, cached) in MEASURED_RELATIVE.items():
        rows.append(
            CalibrationRow(
                f"relative step, {n} frozen, recomputed", "x", recompute, relative_step_cost(costs, one, n, cached=False)
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
