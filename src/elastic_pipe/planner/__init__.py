"""The planner: a dry run of a whole elastic training job, from layer costs to predicted speedup.

It composes the primitives (freeze policies, partition solvers, schedule simulation and micro-batch tuning, the
cache pay-off rule) over an analytic cost model calibrated on measured H200 runs; no GPU is needed.

* :func:`model_shape` / :data:`MODEL_SHAPES` (the model catalogue of :mod:`elastic_pipe.models.catalogue`) and
  :func:`model_work`: transformer shapes and their per-sub-layer work; :func:`price` turns work into per-sample
  times on a :class:`GpuSpec`, and
  :func:`from_layer_costs` does the same from measured :class:`~elastic_pipe.types.LayerCost` records;
* :class:`ClusterSpec`: GPUs, nodes, memory, links;
* :func:`predict_layout`: the step of a layout a run holds (the orchestrator's layout rule chose it, ``v`` stages
  per rank included), and :func:`model_costs`, the FLOP-priced costs of a built model it takes;
* :func:`predict_step`: one layout's step, split into compute, bubble, transfers, all-reduce, cache reads,
  optimizer and fixed host work;
* :class:`JobSpec` and :func:`make_plan`: the per-epoch :class:`Plan` with its static and freeze-only baselines;
* :func:`plan_model`: the one-call path from a model name;
* :func:`plan_to_dict`, :func:`format_table`, :func:`plot_throughput`, :func:`plot_timeline`: reports.
"""

from __future__ import annotations

from elastic_pipe.models.catalogue import MODEL_SHAPES, model_shape
from elastic_pipe.planner.cluster import H200, ClusterSpec, GpuSpec
from elastic_pipe.planner.costs import SubLayerCost, from_layer_costs, price, to_layer_costs
from elastic_pipe.planner.errors import CHECK, PlannerError, PlannerTypeError
from elastic_pipe.planner.job import CACHE_FILLS, CACHE_TIERS, JobSpec
from elastic_pipe.planner.layouts import model_costs, predict_layout
from elastic_pipe.planner.models import MODEL_CONFIGS, ModelConfig, SubLayerWork, model_config, model_work
from elastic_pipe.planner.plan import make_plan
from elastic_pipe.planner.report import format_table, plan_to_dict, plot_throughput, plot_timeline
from elastic_pipe.planner.result import EpochPlan, Plan
from elastic_pipe.planner.step import Mode, StepBreakdown, StepPrediction, predict_step
from elastic_pipe.types import TransformerShape, parse_bytes  # parse_bytes: the one byte-size grammar

__all__ = [
    "CACHE_FILLS",
    "CACHE_TIERS",
    "H200",
    "MODEL_CONFIGS",
    "MODEL_SHAPES",
    "ClusterSpec",
    "EpochPlan",
    "GpuSpec",
    "JobSpec",
    "Mode",
    "ModelConfig",
    "Plan",
    "PlannerError",
    "PlannerTypeError",
    "StepBreakdown",
    "StepPrediction",
    "SubLayerCost",
    "SubLayerWork",
    "TransformerShape",
    "format_table",
    "from_layer_costs",
    "make_plan",
    "model_config",
    "model_costs",
    "model_shape",
    "model_work",
    "parse_bytes",
    "plan_model",
    "plan_to_dict",
    "plot_throughput",
    "plot_timeline",
    "predict_layout",
    "predict_step",
    "price",
    "to_layer_costs",
]


def plan_model(name: str | TransformerShape, cluster: ClusterSpec, job: JobSpec) -> Plan:
    """Plan a catalogued (or given) model shape on ``cluster``: price its work on the cluster's GPU, then plan."""
    config = model_shape(name) if isinstance(name, str) else CHECK.instance("name", name, TransformerShape)
    CHECK.instance("cluster", cluster, ClusterSpec)
    CHECK.instance("job", job, JobSpec)
    return make_plan(price(model_work(config), cluster.gpu), cluster, job, model=config.name)
