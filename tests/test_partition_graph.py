"""The graph solver: hand example with a skip connection, brute force on small DAGs, chain == optimal."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.models.catalogue import model_shape
from elastic_pipe.partition import (
    PartitionError,
    alive_bytes,
    graph_order,
    graph_partition,
    graph_stage_costs,
    solve,
    transformer_costs,
    transformer_graph,
)
from elastic_pipe.types import LayerCost

PROPERTY = settings(max_examples=50, deadline=None)


def objective(graph: nx.DiGraph, order: list[object], bounds: tuple[int, ...], bandwidth: float) -> float:
    """The documented objective, written from its definition (sets of live producers), not from the solver."""
    position = {node: i for i, node in enumerate(order)}

    def crossing(cut: int) -> float:
        total = 0.0
        for u in order:
            sizes = [d.get("bytes", 0) for _, v, d in graph.out_edges(u, data=True) if position[u] < cut <= position[v]]
            total += max(sizes, default=0.0)
        return total

    worst = 0.0
    for a, b in itertools.pairwise(bounds):
        compute = sum(graph.nodes[order[i]]["cost"] for i in range(a, b))
        worst = max(worst, compute + (crossing(a) + crossing(b)) / bandwidth)
    return worst


def brute_force(graph: nx.DiGraph, order: list[object], stages: int, bandwidth: float) -> tuple[float, float]:
    """(smallest bottleneck, fewest bytes cut among the partitions reaching it), by enumeration."""
    n = len(order)
    alive = alive_bytes(graph, order)
    scored = [
        (objective(graph, order, (0, *cuts, n), bandwidth), sum(alive[c] for c in cuts))
        for cuts in itertools.combinations(range(1, n), stages - 1)
    ]
    best = min(score for score, _ in scored)
    return best, min(moved for score, moved in scored if score <= best * (1 + 1e-12))


def diamond() -> nx.DiGraph:
    # a -> b -> c -> d with a skip a -> c carrying 10 bytes; the other edges carry 1.
    g = nx.DiGraph()
    for name in "abcd":
        g.add_node(name, cost=1.0)
    g.add_edge("a", "b", bytes=1)
    g.add_edge("b", "c", bytes=1)
    g.add_edge("c", "d", bytes=1)
    g.add_edge("a", "c", bytes=10)
    return g


def test_alive_bytes_counts_each_producer_once() -> None:
    g = diamond()
    # cut before b: a's tensor (largest of its edges, 10); before c: a (10) + b (1); before d: c (1).
    assert alive_bytes(g, list("abcd")).tolist() == [0.0, 10.0, 11.0, 1.0, 0.0]


def test_skip_connection_moves_the_cut() -> None:
    g = diamond()
    p = graph_partition(g, 2, bandwidth=1.0)
    # cut after a: [a] 1+10, [b,c,d] 3+10 -> 13; after b: 2+11 both -> 13; after c: [a,b,c] 3+1, [d] 1+1 -> 4.
    assert p.layers_per_stage == (3, 1)
    assert p.stage_costs == (4.0, 2.0)
    assert p.solver == "graph"
    # with free transfers it is the chain problem: [a,b | c,d]
    free = graph_partition(g, 2, bandwidth=math.inf)
    assert free.layers_per_stage == (2, 2) and free.bottleneck == 2.0


def random_dag(draw: st.DrawFn) -> nx.DiGraph:
    n = draw(st.integers(min_value=1, max_value=7))
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(i, cost=float(draw(st.integers(0, 20))))
    for j in range(1, n):
        # every node after the first has a producer (a connected network), plus optional skips.
        g.add_edge(j - 1, j, bytes=draw(st.integers(0, 30)))
        for i in range(j - 1):
            if draw(st.booleans()):
                g.add_edge(i, j, bytes=draw(st.integers(0, 30)))
    return g


@PROPERTY
@given(data=st.data())
def test_graph_partition_is_exact_on_small_dags(data: st.DataObject) -> None:
    g = random_dag(data.draw)
    stages = data.draw(st.integers(1, g.number_of_nodes()))
    bandwidth = data.draw(st.sampled_from([1.0, 2.5, 10.0, math.inf]))
    p = graph_partition(g, stages, bandwidth)
    order = graph_order(g)
    assert min(p.layers_per_stage) >= 1 and sum(p.layers_per_stage) == g.number_of_nodes()
    best, fewest_bytes = brute_force(g, order, stages, bandwidth)
    assert p.bottleneck == pytest.approx(best)
    assert sum(alive_bytes(g, order)[b] for b in p.boundaries[1:-1]) == fewest_bytes
    assert p.bottleneck == pytest.approx(objective(g, order, p.boundaries, bandwidth))
    assert graph_stage_costs(g, p.layers_per_stage, bandwidth) == pytest.approx(p.stage_costs)


@PROPERTY
@given(
    costs=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40),
    data=st.data(),
)
def test_chain_with_free_transfers_agrees_with_optimal(costs: list[float], data: st.DataObject) -> None:
    stages = data.draw(st.integers(1, len(costs)))
    g = nx.DiGraph()
    for i, c in enumerate(costs):
        g.add_node(i, cost=c)
        if i:
            g.add_edge(i - 1, i, bytes=data.draw(st.integers(0, 10**6)))
    assert graph_partition(g, stages, math.inf).bottleneck == pytest.approx(solve(costs, stages).bottleneck)


def test_transformer_graph_structure_and_bert_large() -> None:
    records = [LayerCost("embed", forward=1.0, activation_bytes=8), LayerCost("attn", forward=2.0, activation_bytes=8)]
    g = transformer_graph(records, [False, True])
    assert list(g.nodes) == ["embed", "attn", "attn.add"]
    assert set(g.edges) == {("embed", "attn"), ("attn", "attn.add"), ("embed", "attn.add")}
    costs = transformer_costs(model_shape("bert-large"), 8, flops_per_second=1e14)
    bert = transformer_graph(costs, [False] + [True] * 48)
    assert bert.number_of_nodes() == 1 + 48 * 2
    p = graph_partition(bert, 4, bandwidth=1e11)
    assert sum(p.layers_per_stage) == 97
    # no stage boundary falls between a sub-layer and its residual add: that would carry two tensors
    order = graph_order(bert)
    assert all(not str(order[b]).endswith(".add") for b in p.boundaries[1:-1])


def test_graph_errors() -> None:
    cyclic = nx.DiGraph([(0, 1), (1, 0)])
    nx.set_node_attributes(cyclic, 1.0, "cost")
    with pytest.raises(PartitionError, match="cycle"):
        graph_partition(cyclic, 1, 1.0)
    g = diamond()
    with pytest.raises(PartitionError, match="bandwidth must be a number > 0"):
        graph_partition(g, 2, 0.0)
    with pytest.raises(PartitionError, match="cannot cut 4 layers into 5"):
        graph_partition(g, 5, 1.0)
    with pytest.raises(PartitionError, match="not topological"):
        graph_partition(g, 2, 1.0, order=list("bacd"))
    g.nodes["b"]["cost"] = -1.0
    with pytest.raises(PartitionError, match=r"node 'b' cost=-1.0"):
        graph_partition(g, 2, 1.0)
    del g.nodes["b"]["cost"]
    with pytest.raises(PartitionError, match="node 'b' has no 'cost'"):
        graph_partition(g, 2, 1.0)
    with pytest.raises(PartitionError, match="empty"):
        graph_partition(nx.DiGraph(), 1, 1.0)
