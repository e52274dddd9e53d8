"""The ``graph`` solver: partition a layer DAG with skip connections, pricing what crosses each cut.

Input: a :class:`networkx.DiGraph` whose nodes carry a compute cost (attribute ``cost``, seconds) and whose
edges carry the bytes of the tensor flowing along them (attribute ``bytes``; missing means 0). Stages are
contiguous runs of one fixed topological order (the caller's ``order``, else :func:`graph_order`).

Objective, exactly: with ``T(b)`` the bytes alive across cut ``b`` (between positions ``b-1`` and ``b`` of the
order) - every tensor produced before the cut and consumed at or after it, skip connections included, each
producer's tensor counted once (the largest of its crossing edges) - stage ``s`` spanning ``[b_s, b_{s+1})`` costs

    sum of its node costs + (T(b_s) + T(b_{s+1})) / bandwidth

and the solver minimises the largest stage cost; among the partitions reaching that minimum it returns one moving
the fewest bytes across its cuts (sum of ``T`` over the inner cuts), so stages off the critical path do not cut
through a residual connection for nothing. Each boundary is charged to both of its stages because a training
stage sends its output activations forward and its input gradients backward, and a blocking send keeps the sender
busy. ``T(0) = T(n) = 0``. With ``bandwidth = inf`` (or zero bytes) this is the chain problem of ``optimal``.

Algorithm: because the transfer term depends on both ends of a stage, a greedy probe is not exact here; a dynamic
programme over (stages used, cut position) is, in ``O(K n^2)`` vectorised with numpy; a second pass of the same
shape picks the fewest bytes under the optimal bottleneck (a 24-block BERT-large graph of ~100 nodes solves in
well under a millisecond per K).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Hashable, Sequence
from typing import Any

import networkx as nx
import numpy as np

from elastic_pipe.partition._checks import check_costs, check_stages
from elastic_pipe.partition.errors import CHECK, PartitionError
from elastic_pipe.partition.result import Partition
from elastic_pipe.types import LayerCost

__all__ = [
    "MAX_GRAPH_NODES",
    "alive_bytes",
    "chain_graph",
    "graph_chain",
    "graph_order",
    "graph_partition",
    "graph_stage_costs",
    "transformer_graph",
]

#: The dynamic programme holds a few (n+1) x (n+1) float64 matrices; beyond this many nodes that is gigabytes.
MAX_GRAPH_NODES = 4096

#: Relative slack under which two bottlenecks count as equal when choosing the fewest bytes.
_TIE_TOLERANCE = 1e-12


def graph_order(graph: nx.DiGraph) -> list[Hashable]:
    """The default order: the topological order that breaks ties by node insertion order (deterministic)."""
    CHECK.instance("graph", graph, nx.DiGraph)
    rank = {node: i for i, node in enumerate(graph.nodes)}
    try:
        return list(nx.lexicographical_topological_sort(graph, key=rank.__getitem__))
    except nx.NetworkXUnfeasible:
        raise PartitionError("the layer graph has a cycle; it must be a DAG") from None


def _checked_order(graph: nx.DiGraph, order: Sequence[Hashable] | None) -> list[Hashable]:
    CHECK.instance("graph", graph, nx.DiGraph)
    if graph.number_of_nodes() == 0:
        raise PartitionError("the layer graph is empty: need at least one node")
    if order is None:
        return graph_order(graph)
    chosen = CHECK.items("order", order, empty=True)
    if len(chosen) != graph.number_of_nodes() or set(chosen) != set(graph.nodes):
        raise PartitionError("order must list every node of the graph exactly once")
    position = {node: i for i, node in enumerate(chosen)}
    for u, v in graph.edges:
        if position[u] >= position[v]:
            raise PartitionError(f"order is not topological: edge {u!r} -> {v!r} goes backwards")
    return chosen


def _node_costs(graph: nx.DiGraph, order: list[Hashable], cost_attr: str) -> np.ndarray:
    CHECK.str("cost_attr", cost_attr)
    values = np.empty(len(order), dtype=np.float64)
    for i, node in enumerate(order):
        if cost_attr not in graph.nodes[node]:
            raise PartitionError(f"node {node!r} has no {cost_attr!r} attribute (its compute cost)")
        value = graph.nodes[node][cost_attr]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise PartitionError(f"node {node!r} {cost_attr}={value!r}: expected a finite number >= 0")
        values[i] = value
    return values


def alive_bytes(graph: nx.DiGraph, order: Sequence[Hashable], bytes_attr: str = "bytes") -> np.ndarray:
    """``T[b]`` for ``b = 0..n``: bytes of the tensors alive across the cut before position ``b``.

    A producer's tensor is alive across every cut between it and its last consumer; when its out-edges carry
    different sizes, the largest still needed at that cut counts.
    """
    CHECK.instance("graph", graph, nx.DiGraph)
    order = CHECK.items("order", order, empty=True)
    CHECK.str("bytes_attr", bytes_attr)
    n = len(order)
    position = {node: i for i, node in enumerate(order)}
    alive = np.zeros(n + 1, dtype=np.float64)
    for u in order:
        needed = np.zeros(n + 1, dtype=np.float64)
        for _, v, data in graph.out_edges(u, data=True):
            size = data.get(bytes_attr, 0)
            if isinstance(size, bool) or not isinstance(size, (int, float)) or not math.isfinite(size) or size < 0:
                raise PartitionError(f"edge {u!r} -> {v!r} {bytes_attr}={size!r}: expected a finite number >= 0")
            lo, hi = position[u] + 1, position[v] + 1
            np.maximum(needed[lo:hi], size, out=needed[lo:hi])
        alive += needed
    return alive


def _stage_cost_matrix(costs: np.ndarray, alive: np.ndarray, bandwidth: float) -> np.ndarray:
    """``M[i, j]`` = cost of a stage spanning positions ``[i, j)``; ``inf`` where ``j <= i``."""
    n = len(costs)
    prefix = np.concatenate(([0.0], np.cumsum(costs)))
    transfer = alive / bandwidth if math.isfinite(bandwidth) else np.zeros(n + 1)
    matrix = (prefix[None, :] - prefix[:, None]) + (transfer[:, None] + transfer[None, :])
    matrix[np.tril_indices(n + 1)] = math.inf
    return matrix


def graph_stage_costs(
    graph: nx.DiGraph,
    layers_per_stage: Sequence[int],
    bandwidth: float,
    *,
    order: Sequence[Hashable] | None = None,
    cost_attr: str = "cost",
    bytes_attr: str = "bytes",
) -> tuple[float, ...]:
    """Each stage's cost under the graph objective for a given partition of the order (for checks and tools)."""
    chosen = _checked_order(graph, order)
    costs = _node_costs(graph, chosen, cost_attr)
    bounds = [0, *itertools.accumulate(CHECK.ints("layers_per_stage", layers_per_stage))]
    if bounds[-1] != len(chosen):
        raise PartitionError(f"layers_per_stage sums to {bounds[-1]}, the graph has {len(chosen)} nodes")
    return _exact_stage_costs(costs, alive_bytes(graph, chosen, bytes_attr), _checked_bandwidth(bandwidth), bounds)


def _exact_stage_costs(costs: np.ndarray, alive: np.ndarray, bandwidth: float, bounds: list[int]) -> tuple[float, ...]:
    """Stage costs summed segment by segment (prefix-sum differences, used to decide, lose low digits)."""
    transfer = np.zeros_like(alive) if math.isinf(bandwidth) else alive / bandwidth
    return tuple(
        math.fsum(costs[i:j].tolist()) + float(transfer[i] + transfer[j]) for i, j in itertools.pairwise(bounds)
    )


def _checked_bandwidth(bandwidth: float) -> float:
    if not CHECK.number("bandwidth", bandwidth) > 0:
        raise PartitionError(f"bandwidth must be a number > 0 (bytes per second; inf = free), got {bandwidth!r}")
    return float(bandwidth)


def _min_bottleneck(matrix: np.ndarray, stages: int) -> float:
    """Smallest largest-stage cost over ``stages`` non-empty stages: a DP over (stages used, cut position)."""
    best = matrix[0].copy()  # best[j]: smallest bottleneck covering positions [0, j) with the stages so far
    for _ in range(1, stages):
        best = np.min(np.maximum(best[:, None], matrix), axis=0)
    return float(best[-1])


def _fewest_bytes(matrix: np.ndarray, alive: np.ndarray, stages: int, bottleneck: float) -> list[int]:
    """Among partitions whose every stage costs <= ``bottleneck``, the cut positions moving the fewest bytes."""
    n = matrix.shape[0] - 1
    # A relative tolerance so that ties which differ only by rounding of the transfer terms count as ties.
    allowed = matrix <= bottleneck * (1.0 + _TIE_TOLERANCE)
    moved = np.where(allowed[0], 0.0, math.inf)  # moved[j]: fewest bytes cut covering [0, j) so far
    choices: list[np.ndarray] = []
    for _ in range(1, stages):
        candidates = np.where(allowed, (moved + alive)[:, None], math.inf)
        choice = np.argmin(candidates, axis=0)
        moved = candidates[choice, np.arange(n + 1)]
        choices.append(choice)
    cuts = [n]
    for choice in reversed(choices):
        cuts.append(int(choice[cuts[-1]]))
    return [0, *reversed(cuts)]


def graph_partition(
    graph: nx.DiGraph,
    stages: int,
    bandwidth: float,
    *,
    order: Sequence[Hashable] | None = None,
    cost_attr: str = "cost",
    bytes_attr: str = "bytes",
) -> Partition:
    """Cut a layer DAG into ``stages`` contiguous runs of a topological order, minimising the largest stage cost.

    Args:
        graph: nodes with a ``cost_attr`` compute cost, edges with a ``bytes_attr`` tensor size.
        stages: number of stages K, ``1 <= K <= number of nodes``.
        bandwidth: link bandwidth in bytes per second (``math.inf``: transfers are free).
        order: the topological order stages are contiguous in; default :func:`graph_order`.
        cost_attr: node attribute holding the compute cost.
        bytes_attr: edge attribute holding the tensor bytes.

    Returns:
        A partition of the order: stage ``s`` holds ``order[boundaries[s]:boundaries[s+1]]``; ``stage_costs``
        include the transfer terms (see the module docstring for the exact objective).

    Raises:
        PartitionError: on a non-DAG, missing or bad costs, a bad order, bandwidth <= 0 or a bad stage count.
    """
    chosen = _checked_order(graph, order)
    costs = _node_costs(graph, chosen, cost_attr)
    alive = alive_bytes(graph, chosen, bytes_attr)
    link = _checked_bandwidth(bandwidth)
    n = len(chosen)
    check_stages(stages, n)
    if n > MAX_GRAPH_NODES:
        raise PartitionError(
            f"the graph has {n} nodes; the graph solver handles up to {MAX_GRAPH_NODES} (its DP is O(n^2) in "
            "memory) - use solver 'optimal' for a chain without transfer costs"
        )

    start = time.perf_counter()
    matrix = _stage_cost_matrix(costs, alive, link)
    bottleneck = _min_bottleneck(matrix, stages)
    bounds = _fewest_bytes(matrix, alive, stages, bottleneck)
    elapsed = time.perf_counter() - start

    counts = tuple(j - i for i, j in itertools.pairwise(bounds))
    stage_costs = _exact_stage_costs(costs, alive, link, bounds)
    return Partition(layers_per_stage=counts, stage_costs=stage_costs, solver="graph", solve_seconds=elapsed)


def chain_graph(costs: Sequence[float], activation_bytes: Sequence[float] | None = None) -> nx.DiGraph:
    """A chain ``0 -> 1 -> ... -> n-1``: node ``i`` costs ``costs[i]``, edge ``i -> i+1`` carries
    ``activation_bytes[i]`` (layer ``i``'s output; default 0)."""
    costs = check_costs(costs)
    sizes = [0.0] * len(costs) if activation_bytes is None else check_costs(activation_bytes, "activation_bytes")
    if len(sizes) != len(costs):
        raise PartitionError(f"activation_bytes has {len(sizes)} values for {len(costs)} layers")
    graph = nx.DiGraph()
    for index, cost in enumerate(costs):
        graph.add_node(index, cost=cost)
        if index:
            graph.add_edge(index - 1, index, bytes=sizes[index - 1])
    return graph


def graph_chain(
    costs: Sequence[float],
    stages: int,
    /,
    *,
    activation_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    **options: Any,
) -> Partition:
    """The ``graph`` entry of the solver registry: the layers as a chain (:func:`chain_graph`), cut by
    :func:`graph_partition`, so that ``solve(costs, k, "graph", activation_bytes=..., bandwidth=...)`` prices the
    activations crossing each cut. With free transfers it agrees with ``optimal``.

    Args:
        costs: per-layer compute costs.
        stages: number of stages.
        activation_bytes: bytes of each layer's output (default: all 0).
        bandwidth: link bandwidth in bytes per second (default: inf, free).
        **options: ignored.
    """
    return graph_partition(chain_graph(costs, activation_bytes), stages, bandwidth)


def transformer_graph(
    costs: Sequence[LayerCost],
    residual: Sequence[bool],
    *,
    weights: Sequence[float] | None = None,
) -> nx.DiGraph:
    """A layer DAG from sub-layer records, with each residual sub-layer split so its skip connection is explicit.

    A sub-layer ``x -> x + f(x)`` becomes a node ``name`` (computing ``f``, all of the cost) and a node
    ``name + ".add"`` (cost 0), with edges ``prev -> name``, ``name -> name.add`` and the skip ``prev ->
    name.add``. A cut between them keeps both ``x`` and ``f(x)`` alive, which the graph solver prices; a
    non-residual sub-layer is one node. Edge bytes are the producer's ``activation_bytes``.

    Args:
        costs: sub-layer records in model order.
        residual: for each record, whether it is wrapped in a residual connection.
        weights: node costs (default: each record's ``train_time``).

    Returns:
        The DAG, nodes inserted in model order.
    """
    for index, cost in enumerate(costs := CHECK.items("costs", costs, empty=True)):
        CHECK.instance(f"costs[{index}]", cost, LayerCost)
    residual = CHECK.items("residual", residual, empty=True)
    if len(residual) != len(costs):
        raise PartitionError(f"residual has {len(residual)} flags for {len(costs)} sub-layers")
    node_costs = [c.train_time for c in costs] if weights is None else check_costs(weights, "weights")
    if len(node_costs) != len(costs):
        raise PartitionError(f"weights has {len(node_costs)} values for {len(costs)} sub-layers")
    graph = nx.DiGraph()
    previous: tuple[str, int] | None = None  # (node, bytes of its output)
    for record, skip, weight in zip(costs, residual, node_costs, strict=True):
        if record.name in graph or f"{record.name}.add" in graph:
            raise PartitionError(f"duplicate sub-layer name {record.name!r}")
        graph.add_node(record.name, cost=float(weight))
        if previous is not None:
            graph.add_edge(previous[0], record.name, bytes=previous[1])
        if skip:
            add = f"{record.name}.add"
            graph.add_node(add, cost=0.0)
            graph.add_edge(record.name, add, bytes=record.activation_bytes)
            if previous is not None:
                graph.add_edge(previous[0], add, bytes=previous[1])
            previous = (add, record.activation_bytes)
        else:
            previous = (record.name, record.activation_bytes)
    return graph
