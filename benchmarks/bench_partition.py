"""Partition solvers: quality (largest stage / optimum) and solve time on random, heavy-tailed and
transformer-shaped inputs, plus the graph solver on a 24-block BERT-large graph.

Run: ``python benchmarks/bench_partition.py`` (or ``nox -s bench``). Writes ``benchmarks/results/partition.json``
and prints a table. Everything runs in this one process on one core.

Peers: torchgpipe's ``balance.blockpartition.solve`` and DeepSpeed's ``runtime.utils.partition_balanced`` are
measured side by side when importable (``pip install -e ".[bench]"`` installs both from PyPI); the results file
says which were found. Their outputs are priced by the same largest-stage rule as ours, and an empty stage is
counted, not hidden. The textbook O(K n^2) dynamic programme is our own reference implementation, used to check
exactness and to show why it is not used.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from elastic_pipe.models.catalogue import model_shape
from elastic_pipe.partition import (
    PartitionError,
    graph_order,
    graph_partition,
    graph_stage_costs,
    solve,
    transformer_costs,
    transformer_graph,
)

RESULTS = Path(__file__).resolve().parent / "results" / "partition.json"
SEED = 20260101
#: Instances per (input kind, n, K) for the quality table.
INSTANCES = 20
#: Timed runs per speed measurement (the median is reported).
REPEATS = 21
#: Synthetic costs are scaled to parameter counts of this size so the published greedy rule (unit 1e6) sees
#: sizes in millions, the regime it was designed for.
PARAMS_SCALE = 1e6
#: The graph solver's DP is O(K n^2): timed up to this many layers, with fewer repeats.
GRAPH_SPEED_MAX_N = 1000
GRAPH_REPEATS = 3
#: Speed targets from the issue.
TARGETS_MS = {(1000, 64): 10.0, (10000, 64): 100.0}
#: BERT-large graph: micro-batch, device throughput and link bandwidth (the NVLink figure from REFERENCE.md 7).
BERT_MICRO_BATCH = 8
BERT_FLOPS = 400e12
NVLINK_BYTES_PER_S = 286e9
#: A 100 Gb/s inter-node link, where crossing a residual connection starts to matter.
INTERNODE_BYTES_PER_S = 12.5e9


def random_uniform(rng: np.random.Generator, n: int) -> list[float]:
    return (rng.uniform(0.5, 1.5, n) * PARAMS_SCALE).tolist()


def heavy_tailed(rng: np.random.Generator, n: int) -> list[float]:
    return ((rng.pareto(1.5, n) + 0.05) * PARAMS_SCALE).tolist()


def transformer_shaped(rng: np.random.Generator, n: int) -> list[float]:
    # ViT-B-like sub-layers in parameters: a large embedding, attention 2.4M / MLP 4.7M alternating, a small head,
    # with +-2% jitter so ties do not make every solver look alike.
    body = [2.36e6 if i % 2 == 0 else 4.72e6 for i in range(max(n - 2, 0))]
    values = [7.1e6, *body, 0.8e6][:n]
    return (np.asarray(values) * rng.uniform(0.98, 1.02, len(values))).tolist()


KINDS: dict[str, Callable[[np.random.Generator, int], list[float]]] = {
    "random": random_uniform,
    "heavy-tailed": heavy_tailed,
    "transformer": transformer_shaped,
}


def textbook_dp(costs: Sequence[float], stages: int) -> float:
    """Our reference O(K n^2) dynamic programme over (stages, prefix): the bottleneck only."""
    prefix = np.concatenate(([0.0], np.cumsum(costs)))
    n = len(costs)
    best = prefix.copy()  # one stage covering [0, j)
    for _ in range(1, stages):
        new = np.full(n + 1, math.inf)
        for j in range(1, n + 1):
            tails = prefix[j] - prefix[:j]
            new[j] = float(np.min(np.maximum(best[:j], tails)))
        best = new
    return float(best[n])


def peer_status() -> dict[str, str]:
    status = {}
    for module, label in (("torchgpipe", "torchgpipe blockpartition"), ("deepspeed", "DeepSpeed partition_balanced")):
        found = importlib.util.find_spec(module) is not None
        status[label] = "installed" if found else "not installed in this environment (not measured)"
    return status


def _stage_sums_from_bounds(costs: Sequence[float], bounds: Sequence[int]) -> list[float]:
    return [float(sum(costs[a:b])) for a, b in itertools.pairwise(bounds)]


def peer_solvers() -> dict[str, Callable[[Sequence[float], int], list[float]]]:
    """Each importable peer as ``f(costs, k) -> per-stage sums`` (an empty stage sums to 0)."""
    peers: dict[str, Callable[[Sequence[float], int], list[float]]] = {}
    if importlib.util.find_spec("torchgpipe") is not None:
        from torchgpipe.balance import blockpartition

        def torchgpipe_block(costs: Sequence[float], k: int) -> list[float]:
            parts = blockpartition.solve(list(costs), partitions=k)
            return [float(sum(p)) for p in parts] + [0.0] * (k - len(parts))

        peers["torchgpipe"] = torchgpipe_block
    if importlib.util.find_spec("deepspeed") is not None:
        import logging

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        from deepspeed.runtime.utils import partition_balanced

        def deepspeed_balanced(costs: Sequence[float], k: int) -> list[float]:
            return _stage_sums_from_bounds(costs, [int(b) for b in partition_balanced(list(costs), k)])

        peers["deepspeed"] = deepspeed_balanced
    return peers


#: DeepSpeed's partition_balanced is slow (seconds at n=400, k=32): it is measured only up to this many layers.
DEEPSPEED_MAX_N = 200


def peer_rows(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Quality and speed of every importable peer on the same kinds of input as ours."""
    rows = []
    for name, fn in peer_solvers().items():
        for kind, make in KINDS.items():
            for n, k in ((50, 4), (50, 8), (200, 16), (1000, 64)):
                if name == "deepspeed" and n > DEEPSPEED_MAX_N:
                    continue
                ratios, empty, times = [], 0, []
                for _ in range(INSTANCES):
                    costs = make(rng, n)
                    best = solve(costs, k, "optimal").bottleneck
                    start = time.perf_counter()
                    sums = fn(costs, k)
                    times.append(time.perf_counter() - start)
                    empty += int(any(v == 0.0 for v in sums))
                    ratios.append(max(sums) / best)
                rows.append(
                    {
                        "peer": name,
                        "input": kind,
                        "n": n,
                        "k": k,
                        "mean_ratio": statistics.fmean(ratios),
                        "worst_ratio": max(ratios),
                        "empty_stage_instances": empty,
                        "instances": INSTANCES,
                        "median_ms": statistics.median(times) * 1e3,
                        "optimal_ms": median_ms(lambda costs=costs, k=k: solve(costs, k, "optimal"), repeats=5),
                    }
                )
    return rows


def median_ms(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def quality(rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for kind, make in KINDS.items():
        for n, k in ((50, 4), (50, 8), (200, 16), (1000, 64)):
            ratios: dict[str, list[float]] = {"uniform": [], "greedy": []}
            greedy_refused = 0
            for _ in range(INSTANCES):
                costs = make(rng, n)
                best = solve(costs, k, "optimal").bottleneck
                ratios["uniform"].append(solve(costs, k, "uniform").bottleneck / best)
                try:
                    ratios["greedy"].append(solve(costs, k, "greedy").bottleneck / best)
                except PartitionError:
                    greedy_refused += 1
            for solver, values in ratios.items():
                rows.append(
                    {
                        "input": kind,
                        "n": n,
                        "k": k,
                        "solver": solver,
                        "mean_ratio": statistics.fmean(values) if values else None,
                        "worst_ratio": max(values) if values else None,
                        "empty_stage_instances": greedy_refused if solver == "greedy" else 0,
                        "instances": INSTANCES,
                    }
                )
            rows.append(
                {
                    "input": kind,
                    "n": n,
                    "k": k,
                    "solver": "optimal",
                    "mean_ratio": 1.0,
                    "worst_ratio": 1.0,
                    "empty_stage_instances": 0,
                    "instances": INSTANCES,
                }
            )
    return rows


def speed(rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for kind, make in KINDS.items():
        for n, k in ((1000, 64), (10000, 64), (1000, 8), (100000, 64)):
            costs = make(rng, n)
            for solver in ("optimal", "uniform", "greedy", "graph"):
                if (solver == "greedy" and n > 10000) or (solver == "graph" and n > GRAPH_SPEED_MAX_N):
                    continue
                # allow_empty: time the published rule even where it leaves a stage empty
                options = {"allow_empty": True} if solver == "greedy" else {}
                repeats = GRAPH_REPEATS if solver == "graph" else REPEATS
                samples = [solve(costs, k, solver, **options).solve_seconds for _ in range(repeats)]
                call_ms = median_ms(
                    lambda costs=costs, k=k, solver=solver, options=options: solve(costs, k, solver, **options),
                    repeats=repeats,
                )
                rows.append(
                    {
                        "input": kind,
                        "n": n,
                        "k": k,
                        "solver": solver,
                        "median_ms": statistics.median(samples) * 1e3,
                        "call_ms": call_ms,
                        "target_ms": TARGETS_MS.get((n, k)) if solver == "optimal" else None,
                    }
                )
    return rows


def dp_reference(rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for n, k in ((100, 8), (400, 32)):
        costs = heavy_tailed(rng, n)
        exact = textbook_dp(costs, k)
        ours = solve(costs, k, "optimal")
        start = time.perf_counter()
        textbook_dp(costs, k)
        dp_ms = (time.perf_counter() - start) * 1e3
        rows.append(
            {
                "n": n,
                "k": k,
                "textbook_dp_ms": dp_ms,
                "optimal_ms": ours.solve_seconds * 1e3,
                "agree": math.isclose(exact, ours.bottleneck, rel_tol=1e-12),
            }
        )
    return rows


def bert_graph() -> list[dict[str, Any]]:
    costs = transformer_costs(model_shape("bert-large"), BERT_MICRO_BATCH, flops_per_second=BERT_FLOPS)
    graph = transformer_graph(costs, [False] + [True] * (2 * model_shape("bert-large").blocks))
    order = graph_order(graph)
    chain_costs = [graph.nodes[node]["cost"] for node in order]
    rows = []
    for link_name, link in (("nvlink", NVLINK_BYTES_PER_S), ("100Gb/s", INTERNODE_BYTES_PER_S)):
        for k in (2, 4, 8, 16, 32):
            result = graph_partition(graph, k, link)
            call_ms = median_ms(lambda k=k, link=link: graph_partition(graph, k, link), repeats=5)
            # the transfer-blind optimum (sub-layer costs only), priced under the graph objective
            blind = solve(chain_costs, k, "optimal")
            blind_cost = max(graph_stage_costs(graph, blind.layers_per_stage, link))
            cuts_in_residual = sum(str(order[b]).endswith(".add") for b in result.boundaries[1:-1])
            rows.append(
                {
                    "link": link_name,
                    "bandwidth_bytes_per_s": link,
                    "k": k,
                    "nodes": graph.number_of_nodes(),
                    "edges": graph.number_of_edges(),
                    "graph_bottleneck_ms": result.bottleneck * 1e3,
                    "transfer_blind_bottleneck_ms": blind_cost * 1e3,
                    "graph_cuts_inside_a_residual": cuts_in_residual,
                    "blind_cuts_inside_a_residual": sum(str(order[b]).endswith(".add") for b in blind.boundaries[1:-1]),
                    "solve_ms": result.solve_seconds * 1e3,
                    "call_ms": call_ms,
                }
            )
    return rows


def fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> dict[str, Any]:
    """Run every measurement, write the results file and print the tables."""
    rng = np.random.default_rng(SEED)
    results = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "numpy": np.__version__},
        "peers": peer_status(),
        "quality": quality(rng),
        "speed": speed(rng),
        "dp_reference": dp_reference(rng),
        "bert_large_graph": bert_graph(),
        "peer_comparison": peer_rows(rng),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n", encoding="utf-8")

    print("peers:", ", ".join(f"{k}: {v}" for k, v in results["peers"].items()))
    print("\nquality: largest stage / optimum (mean, worst over instances; greedy 'empty' = published rule left a")
    print("stage empty)")
    print(f"{'input':<13}{'n':>6}{'k':>4}  {'solver':<8}{'mean':>8}{'worst':>8}{'empty':>7}")
    for row in results["quality"]:
        print(
            f"{row['input']:<13}{row['n']:>6}{row['k']:>4}  {row['solver']:<8}{fmt(row['mean_ratio']):>8}"
            f"{fmt(row['worst_ratio']):>8}{row['empty_stage_instances']:>7}"
        )
    print("\nsolve time (solver alone, median ms)")
    print(f"{'input':<13}{'n':>7}{'k':>4}  {'solver':<8}{'solver ms':>10}{'call ms':>9}{'target':>8}")
    for row in results["speed"]:
        print(
            f"{row['input']:<13}{row['n']:>7}{row['k']:>4}  {row['solver']:<8}{fmt(row['median_ms']):>10}"
            f"{fmt(row['call_ms']):>9}{fmt(row['target_ms'], '.0f'):>8}"
        )
    print("\ntextbook O(K n^2) DP (our reference) vs optimal")
    for row in results["dp_reference"]:
        print(
            f"n={row['n']:<5} k={row['k']:<3} dp {row['textbook_dp_ms']:.1f} ms  optimal {row['optimal_ms']:.3f} ms"
            f"  agree={row['agree']}"
        )
    print("\nBERT-large sub-layer graph (97 nodes, skip connections explicit), micro-batch 8, 400 TFLOP/s")
    print(f"{'link':<9}{'k':>3}{'graph ms':>10}{'blind ms':>10}{'cuts in res':>12}{'solve ms':>10}{'call ms':>9}")
    for row in results["bert_large_graph"]:
        print(
            f"{row['link']:<9}{row['k']:>3}{row['graph_bottleneck_ms']:>10.3f}"
            f"{row['transfer_blind_bottleneck_ms']:>10.3f}"
            f"{row['graph_cuts_inside_a_residual']:>5}/{row['blind_cuts_inside_a_residual']:<6}"
            f"{row['solve_ms']:>10.2f}{row['call_ms']:>9.2f}"
        )
    print("\npeers vs optimal on the same inputs (largest stage / optimum; 'empty' = instances with an empty stage)")
    print(f"{'peer':<11}{'input':<13}{'n':>6}{'k':>4}{'mean':>8}{'worst':>8}{'empty':>7}{'peer ms':>10}{'ours ms':>9}")
    for row in results["peer_comparison"]:
        print(
            f"{row['peer']:<11}{row['input']:<13}{row['n']:>6}{row['k']:>4}{row['mean_ratio']:>8.3f}"
            f"{row['worst_ratio']:>8.3f}{row['empty_stage_instances']:>7}{row['median_ms']:>10.2f}"
            f"{row['optimal_ms']:>9.3f}"
        )
    print(f"\nwrote {RESULTS}")
    return results


if __name__ == "__main__":
    main()
