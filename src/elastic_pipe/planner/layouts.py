"""One trained layout's step: a :class:`~elastic_pipe.types.Layout` as a run holds it, predicted as it stands.

:func:`model_costs` prices the sub-layers of a built model (its forward FLOPs counted by torch on one sample, at the
GPU's matmul rate; the backward twice that; the eager host work of :data:`HOST_WEIGHT_PER_SUBLAYER` blocks per
sub-layer and pass): a coarse model for any :class:`~elastic_pipe.models.SubLayerModel`, where :func:`price` has the
kernel-by-kernel one for the catalogued transformer shapes. :func:`predict_layout` predicts one layout.

The orchestrator's layout rule chooses the layouts of a run (``K`` ranks per pipeline, ``R`` replicas, ``v`` stages
per rank, their sub-layer boundaries and the micro-batch count); ``elastic-pipe plan --config`` hands them here as
plain :class:`~elastic_pipe.types.Layout` values, so the planner prices exactly the stages training will run and
never re-partitions them. The frozen prefix (the layout's first ``frozen`` sub-layers) sits on stage 0: recomputed
forward-only, or read from a cache in device memory. The step is :func:`~elastic_pipe.planner.step.predict_step`'s
with the layout's partition fixed and its ``v`` stages per rank placed in a loop (stage ``s`` on rank ``s % K``), as
training places them; its bubble is the simulated schedule's idle time on the busiest rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elastic_pipe.models import SubLayerModel, sublayer_costs
from elastic_pipe.planner.cluster import ClusterSpec, GpuSpec
from elastic_pipe.planner.costs import SubLayerCost, check_costs, from_layer_costs
from elastic_pipe.planner.errors import CHECK, PlannerError
from elastic_pipe.planner.models import HOST_WEIGHT_PER_SUBLAYER
from elastic_pipe.planner.step import Mode, StepPrediction, predict_step
from elastic_pipe.schedule import GENERATORS, ScheduleError
from elastic_pipe.types import Layout

__all__ = ["model_costs", "predict_layout"]


def model_costs(model: SubLayerModel, example: torch.Tensor, gpu: GpuSpec) -> tuple[SubLayerCost, ...]:
    """Per-sample costs of ``model``'s sub-layers on ``gpu``, from the FLOPs of one pass over ``example``.

    Args:
        model: the model (its weights anywhere, the meta device included); its ``unit_ends`` are the units.
        example: an input batch of at least one sample, on the model's device.
        gpu: the GPU whose matmul rate and host overhead price the work.

    Raises:
        ModelError: an empty example, or a sub-layer that does not return one tensor.
    """
    CHECK.instance("model", model, SubLayerModel)
    CHECK.instance("gpu", gpu, GpuSpec)
    batch = int(example.shape[0]) if example.dim() else 0
    records = sublayer_costs(model, example, micro_batch=max(batch, 1), flops_per_second=gpu.matmul_flops)
    return from_layer_costs(records, max(batch, 1), tuple(model.unit_ends), host_weight=HOST_WEIGHT_PER_SUBLAYER)


def _entries(costs: Sequence[SubLayerCost], frozen: int, *, cached: bool) -> list[tuple[SubLayerCost, Mode]]:
    prefix = Mode.CACHED if cached else Mode.FROZEN
    return [(c, prefix if i < frozen else Mode.ACTIVE) for i, c in enumerate(costs)]


def predict_layout(
    costs: Sequence[SubLayerCost],
    cluster: ClusterSpec,
    layout: Layout,
    *,
    schedule: str,
    global_batch: int,
    cached: bool = False,
) -> StepPrediction:
    """Predict one step of ``layout`` under ``schedule``.

    Args:
        costs: per-sample costs of every sub-layer of the model, in order (the layout's boundaries index them).
        cluster: the cluster; its GPU count must be the layout's ``pipe_len * replicas``.
        layout: the layout, its ``virtual`` stages per rank included.
        schedule: a schedule kind of :data:`elastic_pipe.schedule.GENERATORS` that takes ``layout.virtual``
            stages per rank.
        global_batch: samples per optimizer step over all replicas.
        cached: read the frozen prefix's output from a cache in device memory instead of recomputing it.

    Returns:
        The predicted step (``chunks`` is ``layout.virtual``; ``breakdown.bubble`` the schedule's idle time).

    Raises:
        PlannerError: costs that do not cover the layout's sub-layers, a cluster of another size, an unknown
            schedule or one that does not take ``layout.virtual`` stages per rank, or a batch smaller than the
            micro-batch count.
    """
    check_costs("costs", costs)
    CHECK.instance("cluster", cluster, ClusterSpec)
    CHECK.instance("layout", layout, Layout)
    CHECK.str("schedule", schedule)
    CHECK.int("global_batch", global_batch, lo=1)
    if schedule not in GENERATORS:
        raise PlannerError(f"unknown schedule {schedule!r}; expected one of {sorted(GENERATORS)}")
    if layout.boundaries[-1] != len(costs):
        raise PlannerError(
            f"the layout's stages end at sub-layer {layout.boundaries[-1]}, but the costs describe {len(costs)}"
        )
    if cluster.gpus != layout.world_size:
        raise PlannerError(f"the layout occupies {layout.world_size} GPUs, the cluster has {cluster.gpus}")
    read = costs[layout.frozen - 1].output_bytes / cluster.gpu_cache_bandwidth if cached and layout.frozen else 0.0
    counts = layout.layers_per_stage
    try:
        return predict_step(
            _entries(costs, layout.frozen, cached=cached),
            cluster,
            global_batch=global_batch,
            pipe_len=layout.pipe_len,
            microbatches=layout.microbatches,
            schedule=schedule,
            chunks=layout.virtual,
            cache_seconds_per_sample=read,
            # stage 0 holds the frozen prefix before its active sub-layers
            layers_per_stage=(layout.frozen + counts[0], *counts[1:]),
        )
    except ScheduleError as exc:  # the schedule does not take this many stages per rank or micro-batches
        raise PlannerError(f"{schedule} at K={layout.pipe_len}, v={layout.virtual}: {exc}") from None
