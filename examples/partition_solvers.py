"""Partition a ViT-B/16-sized model, freeze blocks, re-partition and compress the pipeline.

Run: python examples/partition_solvers.py

Shows the four solvers side by side on the analytic sub-layer cost model, then follows a freeze schedule: at each
step the active layers are re-partitioned (milliseconds) and the published halving rule picks the pipeline length.
"""

from __future__ import annotations

from elastic_pipe.models.catalogue import model_shape
from elastic_pipe.partition import (
    compress_halving,
    compress_memory,
    graph_partition,
    initial_budget,
    solve,
    transformer_costs,
    transformer_graph,
    weights_from_costs,
)

#: Sustained bf16 throughput used to turn FLOPs into seconds (an H200 runs ~790 TFLOP/s on large products).
FLOPS = 400e12
MICRO_BATCH = 32
STAGES = 8
#: A per-device memory budget small enough that the unfrozen model needs a pipeline (the model needs ~3.9 GiB).
BUDGET_BYTES = 1 * 2**30
#: Blocks frozen at epochs 0..5 of the alpha = 1/3 schedule for 12 blocks (REFERENCE.md section 2).
FROZEN_BLOCKS = (0, 4, 7, 9, 10, 11)


def main() -> None:
    """Compare the solvers, then compress the pipeline as blocks freeze."""
    # 24 sub-layers (no embedding)
    costs = transformer_costs(model_shape("vit-b16"), MICRO_BATCH, flops_per_second=FLOPS)
    times = weights_from_costs(costs, "time")
    params = weights_from_costs(costs, "params")

    print(f"ViT-B/16, {len(costs)} sub-layers, {STAGES} stages, micro-batch {MICRO_BATCH}")
    for solver in ("uniform", "greedy", "optimal"):
        p = solve(params, STAGES, solver)
        print(f"  {solver:<8} by params: layers {p.layers_per_stage}  largest {p.bottleneck / 1e6:.2f}M params")
    graph = transformer_graph(costs, [True] * len(costs))
    g = graph_partition(graph, STAGES, bandwidth=12.5e9)
    print(f"  graph    by time + 100 Gb/s transfers: nodes {g.layers_per_stage}  largest {g.bottleneck * 1e3:.3f} ms")
    print(f"  optimal  by time alone: largest {solve(times, STAGES).bottleneck * 1e3:.3f} ms")

    # The published flow: M0 from the full model, then at each freeze the active layers compress by halving.
    budget = initial_budget(params, STAGES)
    print(f"\nfreezing (M0 = {budget / 1e6:.2f}M params per device, published halving rule with greedy):")
    pipe_len = STAGES
    for blocks in FROZEN_BLOCKS:
        active = params[2 * blocks :]
        result = compress_halving(active, pipe_len, budget)
        pipe_len = result.pipe_len
        memory = compress_memory(weights_from_costs(costs[2 * blocks :], "memory"), STAGES, BUDGET_BYTES)
        print(
            f"  {blocks:>2} blocks frozen: pipe_len {pipe_len} {result.partition.layers_per_stage}"
            f"  | memory rule (1 GiB/device): pipe_len {memory.pipe_len}"
            f"  | solved in {result.partition.solve_seconds * 1e3:.3f} ms"
        )


if __name__ == "__main__":
    main()
