"""Dry-run elastic training of ViT-B/16 on 16 GPUs (two nodes of 8 x 16 GiB) before spending any GPU time.

    python examples/plan_vit.py [--plot DIR]

Prints the per-epoch plan (frozen blocks, pipeline length, replicas, micro-batches, the step-time breakdown)
starting from an 8-stage pipeline, the speedup over the best static layout and over freezing alone, and how the
answer changes with a measured cost instead of the analytic one (here: the same model with host overhead removed,
as CUDA graphs or torch.compile would).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from elastic_pipe.planner import (
    ClusterSpec,
    GpuSpec,
    JobSpec,
    format_table,
    parse_bytes,
    plan_model,
    plot_throughput,
    plot_timeline,
)


def main() -> None:
    """Plan, print, optionally plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="folder for planner_throughput.png and planner_timeline.png")
    args = parser.parse_args()

    cluster = ClusterSpec(gpus=16, gpus_per_node=8, gpu=GpuSpec(memory=parse_bytes("16GiB")))
    job = JobSpec(global_batch=1024, epochs=10, steps_per_epoch=1252, policy="alpha", policy_options={"alpha": 1 / 3},
                  pipe_len=8)  # fmt: skip
    plan = plan_model("vit-b16", cluster, job)
    print(format_table(plan))

    # The same job with the eager host overhead gone (CUDA graphs / torch.compile): small micro-batches stop
    # being host-bound, so pipelines lose less to their many micro-batches.
    graphs = replace(cluster, gpu=replace(cluster.gpu, host_overhead=0.0))
    compiled = plan_model("vit-b16", graphs, job)
    print(f"\nwithout host overhead: {compiled.speedup:.2f}x over static (eager: {plan.speedup:.2f}x)")

    if args.plot:
        print(plot_throughput(plan, f"{args.plot}/planner_throughput.png"))
        print(plot_timeline(plan, f"{args.plot}/planner_timeline.png"))


if __name__ == "__main__":
    main()
