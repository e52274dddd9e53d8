"""The cost model against measured runs.

* :func:`h200_calibration`: REFERENCE.md section 7's ViT-B/16 numbers on the lent 2x H200 machine, predicted with
  the default :class:`~elastic_pipe.planner.GpuSpec` and :class:`~elastic_pipe.planner.ClusterSpec`; the tests hold
  every row within :data:`CALIBRATION_TOLERANCE` (or within 1% of a full step for near-zero ratios).
* :func:`cpu_calibration`: profile a small model on the CPU, predict its step, run it and time it.
* :func:`gpu_benchmark_calibration`: the orchestrator's measured epochs on 2x H200 (the GPU benchmark, read by
  :func:`load_gpu_benchmark`), predicted per epoch: ``benchmarks/results/gpu_2xh200_vit_session1.json`` is the
  run the host terms were fitted on, ``gpu_2xh200_vit_session2.json`` and ``gpu_2xh200_vit.json`` later runs that
  check them out of sample.

docs/planner.md prints the tables.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from elastic_pipe.freeze import AlphaSchedule, frozen_by_epoch
from elastic_pipe.partition import profile_layers
from elastic_pipe.planner.cluster import ClusterSpec, GpuSpec
from elastic_pipe.planner.costs import SubLayerCost, from_layer_costs, price
from elastic_pipe.planner.errors import PlannerError
from elastic_pipe.planner.job import JobSpec
from elastic_pipe.planner.models import model_config, model_work
from elastic_pipe.planner.plan import make_plan
from elastic_pipe.planner.step import Mode, predict_step
from elastic_pipe.types import LayerCost

__all__ = [
    "BARE_LOOP_GPU",
    "CALIBRATION_TOLERANCE",
    "GPU_BENCHMARK_ARMS",
    "ArmMeasurement",
    "CalibrationRow",
    "cpu_calibration",
    "cpu_model",
    "format_rows",
    "gpu_benchmark_calibration",
    "h200_calibration",
    "load_gpu_benchmark",
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


#: An H200 timed in a bare training loop, as REFERENCE.md section 7 and ``examples/plan_calibrate.py`` time a
#: step: the batch already on the device (no data phase), fused AdamW (one kernel over all tensors, no per-tensor
#: Python loop), no device synchronisation between phases (the host's own per-step work runs ahead, hidden behind
#: queued GPU work). ``examples/plan_calibrate.py``'s loop measured 92.4 ms where section 7 measured 92.5 ms. The
#: defaults of :class:`GpuSpec` describe the orchestrator instead, which pays those per-step costs.
BARE_LOOP_GPU = GpuSpec(data_overhead=0.0, pass_overhead=0.0, optimizer_sublayer_overhead=0.0)


def h200_calibration(one: ClusterSpec | None = None, two: ClusterSpec | None = None) -> list[CalibrationRow]:
    """Predict REFERENCE.md section 7's ViT-B/16 measurements; defaults: 1 and 2 H200s on one node, timed in a
    bare loop (:data:`BARE_LOOP_GPU`)."""
    one = one or ClusterSpec(1, gpu=BARE_LOOP_GPU)
    two = two or ClusterSpec(2, gpu=BARE_LOOP_GPU)
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
#: Leading epochs of every arm left out: the first epoch carries the job's warm-up (CUDA and NCCL
#: initialisation, allocator growth, autotuning), 20-30% slower than the same layout's next epoch.
WARMUP_EPOCHS = 1


@dataclass(frozen=True, slots=True)
class ArmMeasurement:
    """One measured arm of the GPU benchmark, run in one layout throughout.

    Attributes:
        name: the arm's name.
        frozen: frozen units per epoch.
        cache: whether the frozen prefix was read from the activation cache (filled in the transitions).
        samples_per_s: measured throughput per epoch (transitions excluded).
        epoch_seconds: measured seconds per epoch (transitions excluded).
        pipe_len: pipeline stages (1: DDP over every GPU).
        microbatches: micro-batches per step and replica.
        schedule: the pipeline schedule kind.
    """

    name: str
    frozen: tuple[int, ...]
    cache: bool
    samples_per_s: tuple[float, ...]
    epoch_seconds: tuple[float, ...]
    pipe_len: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if not self.frozen or not len(self.frozen) == len(self.samples_per_s) == len(self.epoch_seconds):
            raise PlannerError(
                f"arm {self.name!r} needs one frozen count, throughput and duration per epoch, got "
                f"{len(self.frozen)}, {len(self.samples_per_s)} and {len(self.epoch_seconds)}"
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
    """Predict the orchestrator's measured epochs: one row per steady epoch, then one per arm for the run.

    Every arm is planned as it ran: ViT-B/16 with the measured frozen counts, in the arm's layout (pipeline
    length, micro-batches, schedule), the cache on or off as measured and filled in the transitions
    (``cache_fill="transition"``, as the orchestrator does). The first :data:`WARMUP_EPOCHS` epochs of each arm
    are left out (warm-up). Measured throughput and epoch times exclude transitions, and so do the predictions.

    Args:
        arms: measured arms by name (e.g. ``load_gpu_benchmark(path)["arms"]``).
        gpus: GPUs of the run (one node).
        global_batch: samples per step.
        steps_per_epoch: steps per epoch.
        cluster: the cluster; default ``ClusterSpec(gpus, gpus_per_node=gpus)`` with the H200 defaults.

    Returns:
        Per steady epoch "<arm>, epoch e (f frozen)" in samples/s, and per arm "<arm>, steady epochs: run time" in
        seconds (the sum over its steady epochs).
    """
    cluster = cluster or ClusterSpec(gpus, gpus_per_node=gpus)
    costs = price(model_work(model_config("vit-b16")), cluster.gpu)
    rows: list[CalibrationRow] = []
    for name, arm in arms.items():
        job = JobSpec(
            global_batch=global_batch,
            epochs=len(arm.frozen),
            steps_per_epoch=steps_per_epoch,
            frozen=arm.frozen,
            pipe_len=arm.pipe_len,
            microbatches=arm.microbatches,
            schedule=arm.schedule,
            cache=arm.cache,
            cache_fill="transition",
        )
        plan = make_plan(costs, cluster, job, model="vit-b16")
        steady = range(WARMUP_EPOCHS, len(arm.frozen))
        for e in steady:
            rows.append(
                CalibrationRow(
                    f"{name}, epoch {e} ({arm.frozen[e]} frozen)",
                    "samples/s",
                    arm.samples_per_s[e],
                    plan.epochs[e].throughput,
                )
            )
        if steady:
            rows.append(
                CalibrationRow(
                    f"{name}, steady epochs: run time",
                    "s",
                    math.fsum(arm.epoch_seconds[e] for e in steady),
                    math.fsum(plan.epochs[e].steps * plan.epochs[e].step.step_time for e in steady),
                )
            )
    return rows


#: Values at least this large print as whole numbers with thousands separators.
_WHOLE = 100


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= _WHOLE else f"{value:.3g}"


def format_rows(rows: Sequence[CalibrationRow]) -> str:
    """A Markdown table of calibration rows: measured, predicted and the relative error."""
    lines = ["| measured | unit | measured | predicted | error |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.name} | {r.unit} | {_number(r.measured)} | {_number(r.predicted)} | {r.error:+.1%} |")
    return "\n".join(lines)
