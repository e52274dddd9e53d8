"""The planner's calibration data and the code that measures or reads it (the library keeps none of it).

* :func:`h200_calibration`: ViT-B/16 training steps timed on the lent H200s in a bare loop (bf16 autocast, eager,
  fused AdamW), predicted with :data:`elastic_pipe.planner.calibration.BARE_LOOP_GPU`. The measured numbers are
  the ``H200_*`` constants below (docs/planner.md, "Against the H200 measurements", prints the table).
* :func:`cpu_calibration`: profile a small model on this CPU, predict its step, run it and time it.
* :func:`load_gpu_benchmark` and :func:`gpu_benchmark_calibration`: the orchestrator's measured epochs on 2x H200
  (``benchmarks/gpu/bench_elastic_gpu.py``), read from ``benchmarks/results/gpu_2xh200_vit*.json`` and predicted
  per epoch: ``gpu_2xh200_vit_session1.json`` is the run the planner's per-step host terms were fitted on,
  ``gpu_2xh200_vit_session2.json`` and ``gpu_2xh200_vit.json`` later runs that check them out of sample.

``tests/test_planner_calibration.py`` holds the predictions to :data:`CALIBRATION_TOLERANCE`;
``benchmarks/bench_planner.py`` prints the tables.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from elastic_pipe.freeze import AlphaSchedule, frozen_by_epoch
from elastic_pipe.partition import profile_layers
from elastic_pipe.planner import ClusterSpec, GpuSpec, PlannerError, from_layer_costs, model_shape, model_work, price
from elastic_pipe.planner.calibration import (
    BARE_LOOP_GPU,
    ArmMeasurement,
    CalibrationRow,
    frozen_entries,
    layout_step,
    predict_arms,
    relative_step_cost,
)
from elastic_pipe.planner.step import predict_step
from elastic_pipe.types import LayerCost

__all__ = [
    "CALIBRATION_TOLERANCE",
    "GPU_BENCHMARK_ARMS",
    "cpu_calibration",
    "cpu_model",
    "gpu_benchmark_calibration",
    "h200_calibration",
    "load_gpu_benchmark",
]

#: The issue's target: measured quantities predicted within 15%.
CALIBRATION_TOLERANCE = 0.15

# --- ViT-B/16 on the lent H200s, bare training loop (bf16 autocast, eager, fused AdamW) -------------------------
#: Global batch of the one-GPU measurements.
ONE_GPU_BATCH = 256
#: Global batch of the two-GPU measurements.
TWO_GPU_BATCH = 512
#: One GPU, batch 256: a training step (ms) and its peak memory (GiB).
H200_STEP_MS = 92.5
H200_PEAK_GIB = 17.6
#: Relative step costs with N of 12 blocks frozen: N -> (recomputed, read from a GPU cache).
H200_RELATIVE = {3: (0.81, 0.73), 6: (0.64, 0.49), 9: (0.48, 0.25), 12: (0.32, 0.02)}
#: alpha = 1/3 over 10 epochs: mean relative step recomputed and cached, and the ideal speedup with the cache.
H200_ALPHA_MEAN_RECOMPUTED = 0.50
H200_ALPHA_MEAN_CACHED = 0.28
H200_ALPHA_IDEAL_SPEEDUP = 3.6
#: Two GPUs, batch 512 (samples/s): DDP; a 2-stage 1F1B pipeline at its best micro-batch count; DDP with
#: :data:`H200_DDP_FROZEN` blocks frozen, recomputed and read from a GPU cache.
H200_DDP = 5332
H200_PIPELINE = 4256
H200_PIPELINE_MICROBATCHES = 8
H200_DDP_FROZEN = 6
H200_DDP_FROZEN_RECOMPUTED = 8310
H200_DDP_FROZEN_CACHED = 11256


def h200_calibration(one: ClusterSpec | None = None, two: ClusterSpec | None = None) -> list[CalibrationRow]:
    """Predict the H200 measurements above; defaults: 1 and 2 H200s on one node, timed in a bare loop."""
    one = one or ClusterSpec(1, gpu=BARE_LOOP_GPU)
    two = two or ClusterSpec(2, gpu=BARE_LOOP_GPU)
    costs = price(model_work(model_shape("vit-b16")), one.gpu)
    full = layout_step(costs, one, batch=ONE_GPU_BATCH)
    rows = [
        CalibrationRow("one GPU, batch 256: training step", "ms", H200_STEP_MS, 1e3 * full.step_time),
        CalibrationRow("one GPU, batch 256: peak memory", "GiB", H200_PEAK_GIB, full.stage_memory[0] / 2**30),
    ]
    for n, (recompute, cached) in H200_RELATIVE.items():
        for kind, measured, on in (("recomputed", recompute, False), ("GPU cache", cached, True)):
            predicted = relative_step_cost(costs, one, n, cached=on, batch=ONE_GPU_BATCH)
            rows.append(CalibrationRow(f"relative step, {n} frozen, {kind}", "x", measured, predicted))
    schedule = frozen_by_epoch(AlphaSchedule(12, 1 / 3), 10)

    def mean(cached: bool) -> float:
        relative = (relative_step_cost(costs, one, f, cached=cached, batch=ONE_GPU_BATCH) for f in schedule)
        return math.fsum(relative) / len(schedule)

    mean_recompute, mean_cached = mean(False), mean(True)

    def throughput(**layout: Any) -> float:
        return TWO_GPU_BATCH / layout_step(costs, two, batch=TWO_GPU_BATCH, **layout).step_time

    rows += [
        CalibrationRow("alpha=1/3, 10 epochs: mean step, recomputed", "x", H200_ALPHA_MEAN_RECOMPUTED, mean_recompute),
        CalibrationRow("alpha=1/3, 10 epochs: mean step, cached", "x", H200_ALPHA_MEAN_CACHED, mean_cached),
        CalibrationRow(
            "alpha=1/3, 10 epochs: ideal speedup with cache", "x", H200_ALPHA_IDEAL_SPEEDUP, 1 / mean_cached
        ),
        CalibrationRow("two GPUs, batch 512: DDP", "samples/s", H200_DDP, throughput()),
        CalibrationRow(
            "two GPUs, batch 512: 1F1B, 2 stages, 8 micro-batches",
            "samples/s",
            H200_PIPELINE,
            throughput(pipe_len=2, microbatches=H200_PIPELINE_MICROBATCHES),
        ),
        CalibrationRow(
            "two GPUs, batch 512: DDP, 6 frozen, recomputed",
            "samples/s",
            H200_DDP_FROZEN_RECOMPUTED,
            throughput(frozen=H200_DDP_FROZEN),
        ),
        CalibrationRow(
            "two GPUs, batch 512: DDP, 6 frozen, GPU cache",
            "samples/s",
            H200_DDP_FROZEN_CACHED,
            throughput(frozen=H200_DDP_FROZEN, cached=True),
        ),
    ]
    return rows


# --- a small model on this CPU ------------------------------------------------------------------------------------
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
    median round kept per layer (one profile is still hit when other work holds the core for a while); layers and
    step are timed on this thread's CPU clock (other processes on the machine cannot inflate either), the step
    the fastest of ``repeats``; the prediction is the planner's
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
        records = _median_profile(
            [profile_layers(layers, x, repeats=repeats, warmup=2, cpu_clock="thread") for _ in range(rounds)]
        )
        costs = from_layer_costs(records, batch, unit_ends=list(range(2, blocks + 2)))
        cluster = ClusterSpec(1, gpu=GpuSpec(name="cpu", host_overhead=0.0))
        rows = []
        for f in frozen:
            entries = frozen_entries(costs, f, cached=False)
            step = predict_step(entries, cluster, global_batch=batch, pipe_len=1, microbatches=1)
            measured = _measure_step(layers, x, f + 1 if f else 0, repeats)
            name = f"CPU, {blocks} blocks x {width}, batch {batch}, {f} frozen units"
            rows.append(CalibrationRow(name, "ms", 1e3 * measured, 1e3 * step.breakdown.compute))
    finally:
        torch.set_num_threads(threads)
    return rows


# --- the GPU benchmark's result files ----------------------------------------------------------------------------
#: The GPU benchmark's arms that :func:`gpu_benchmark_calibration` predicts: DDP without freezing, freezing with
#: the frozen prefix recomputed, freezing with the prefix read from the activation cache, and the static
#: two-stage pipelines (GPipe and 1F1B, 4 and 8 micro-batches).
GPU_BENCHMARK_ARMS = (
    "static_ddp",
    "freeze_only",
    "elastic_cache",
    "static_pipe2_gpipe_m4",
    "static_pipe2_gpipe_m8",
    "static_pipe2_1f1b_m4",
    "static_pipe2_1f1b_m8",
)


def load_gpu_benchmark(path: str | Path, workload: str = "vit") -> dict[str, Any]:
    """Read a GPU benchmark result file: the job (GPUs, global batch, steps per epoch) and the measured arms.

    Returns:
        ``{"gpus", "global_batch", "steps_per_epoch", "arms": {name: ArmMeasurement}}`` for the arms of
        :data:`GPU_BENCHMARK_ARMS` present in the file.

    Raises:
        PlannerError: the file lacks the workload or an arm's per-epoch numbers.
    """
    data = json.loads(Path(path).read_text())
    try:
        work = data["workloads"][workload]
        arms = {}
        for name, a in work["arms"].items():
            if name not in GPU_BENCHMARK_ARMS:
                continue
            config, pipe_len = a["config"], int(a["pipe_len"][0])
            by_len = config.get("microbatches_by_pipe_len") or {}
            arms[name] = ArmMeasurement(
                name=name,
                frozen=tuple(int(f) for f in a["frozen_units"]),
                cache=any(a["cache"]),
                samples_per_s=tuple(float(v) for v in a["samples_per_s"]),
                epoch_seconds=tuple(float(v) for v in a["epoch_seconds"]),
                pipe_len=pipe_len,
                microbatches=int(by_len.get(str(pipe_len), config["microbatches"])),
                schedule=str(config["schedule"]),
            )
        first = next(iter(work["arms"].values()))["config"]
        return {
            "gpus": int(data["gpus"]),
            "global_batch": int(first["global_batch"]),
            "steps_per_epoch": int(work["steps_per_epoch"]),
            "arms": arms,
        }
    except (KeyError, TypeError, IndexError, StopIteration) as exc:
        raise PlannerError(f"{path} is not a GPU benchmark result with workload {workload!r}: missing {exc}") from exc


def gpu_benchmark_calibration(
    arms: Mapping[str, ArmMeasurement],
    *,
    gpus: int = 2,
    global_batch: int = TWO_GPU_BATCH,
    steps_per_epoch: int = 10,
    cluster: ClusterSpec | None = None,
) -> list[CalibrationRow]:
    """The GPU benchmark's ViT-B/16 arms predicted per steady epoch (:func:`~elastic_pipe.planner.calibration.
    predict_arms`) on ``cluster``, default ``ClusterSpec(gpus, gpus_per_node=gpus)`` with the H200 defaults."""
    cluster = cluster or ClusterSpec(gpus, gpus_per_node=gpus)
    costs = price(model_work(model_shape("vit-b16")), cluster.gpu)
    return predict_arms(
        arms, costs, cluster, global_batch=global_batch, steps_per_epoch=steps_per_epoch, model="vit-b16"
    )
