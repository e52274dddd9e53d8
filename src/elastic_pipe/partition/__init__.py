"""Partition solvers: per-layer cost models, contiguous stage partitions (uniform, greedy, optimal, graph),
pipeline compression and a profiler that measures real modules into cost records.

* :func:`solve` with the :data:`SOLVERS` registry: ``uniform`` (equal layer counts), ``greedy`` (PipeTransformer's
  published rule, reproduced exactly), ``optimal`` (exact min-max by exact bisection, milliseconds at 10,000 layers),
  ``graph`` (a chain whose cuts pay for the activations crossing them);
* :func:`graph_partition`: a layer DAG with skip connections, pricing every tensor alive across a cut;
* :func:`compress_halving` (published) and :func:`compress_memory`: the shortest pipeline that still fits;
* :func:`weights_from_costs`, :func:`transformer_costs`: cost models; :func:`profile_layers`: measured costs.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.partition.compress import (
    Compression,
    compress_halving,
    compress_memory,
    divisors,
    initial_budget,
)
from elastic_pipe.partition.costs import (
    METRICS,
    TrainingPrecision,
    TransformerShape,
    training_memory_bytes,
    transformer_costs,
    weights_from_costs,
)
from elastic_pipe.partition.errors import PartitionError, PartitionTypeError
from elastic_pipe.partition.graph import (
    MAX_GRAPH_NODES,
    alive_bytes,
    chain_graph,
    graph_chain,
    graph_order,
    graph_partition,
    graph_stage_costs,
    transformer_graph,
)
from elastic_pipe.partition.greedy import DEFAULT_FROZEN_FACTOR, PUBLISHED_UNIT, greedy
from elastic_pipe.partition.optimal import optimal, optimal_bottleneck
from elastic_pipe.partition.pricing import PricedSolver, prices_frozen_itself
from elastic_pipe.partition.profiler import profile_layers
from elastic_pipe.partition.registry import SOLVERS, Solver, price_frozen, register_solver, solve
from elastic_pipe.partition.result import Partition
from elastic_pipe.partition.uniform import uniform
from elastic_pipe.types import parse_bytes  # the one byte-size grammar, re-exported

__all__ = [
    "DEFAULT_FROZEN_FACTOR",
    "MAX_GRAPH_NODES",
    "METRICS",
    "PUBLISHED_UNIT",
    "SOLVERS",
    "Compression",
    "Partition",
    "PartitionError",
    "PartitionTypeError",
    "PricedSolver",
    "Solver",
    "TrainingPrecision",
    "TransformerShape",
    "alive_bytes",
    "chain_graph",
    "compress_halving",
    "compress_memory",
    "divisors",
    "graph_chain",
    "graph_order",
    "graph_partition",
    "graph_stage_costs",
    "greedy",
    "initial_budget",
    "optimal",
    "optimal_bottleneck",
    "parse_bytes",
    "price_frozen",
    "prices_frozen_itself",
    "profile_layers",
    "register_solver",
    "solve",
    "training_memory_bytes",
    "transformer_costs",
    "transformer_graph",
    "uniform",
    "weights_from_costs",
]
