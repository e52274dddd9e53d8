"""Show who does what for a world size and pipeline length.

--layout spmd (default): one process per device; rank r runs stage r % K of pipeline replica r // K, so a
pipeline is a block of consecutive ranks and stays inside a node (pass --gpus-per-node to check that). Lists each
rank's replica, stage, pipeline group (the ranks of its replica, in stage order) and data-parallel group (the same
stage in every replica).

--layout pipetransformer: the published one-process-per-pipeline layout. With initial length K0 and current
length K, the active ranks are d*K0 + i for every block d of K0 ranks and i < K0/K; the new ranks are those
activated by going from 2K to K.
"""

from __future__ import annotations

import argparse
from typing import Any

from elastic_pipe.cli._common import CliInputError, add_json_flag, check_limit, emit

HELP = "Show the rank layout (replica, stage, groups) for a world size and pipeline length."

LAYOUTS = ("spmd", "pipetransformer")

#: Upper bounds: the world size is the group layouts' own (``groups.spmd.MAX_WORLD_SIZE``). The SPMD table lists,
#: for every rank, its pipeline group (K ranks) and data-parallel group (W/K ranks), W x (K + W/K) numbers in all,
#: so that count is bounded too (measured: 1.6M numbers, 8192 ranks in pipelines of 128, are 23 MB of JSON and take
#: 8 s).
MAX_TABLE_ENTRIES = 2_000_000
LIMIT_REASON = "larger layouts take minutes to print and are too large to read"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    parser.add_argument("--world-size", type=int, required=True, metavar="W", help="number of processes (devices)")
    parser.add_argument("--pipe-len", type=int, required=True, metavar="K", help="pipeline length (stages)")
    parser.add_argument(
        "--initial-pipe-len",
        type=int,
        default=None,
        metavar="K0",
        help="pipetransformer layout: pipeline length at the start (default: K)",
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="spmd", help="rank layout (default: spmd)")
    parser.add_argument("--gpus-per-node", type=int, default=None, metavar="G", help="spmd layout: devices per node")
    add_json_flag(parser)


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    return "[" + ", ".join(str(r) for r in ranks) + "]" if ranks else "none"


def _spmd(args: argparse.Namespace) -> int:
    from elastic_pipe.groups import plan_spmd  # noqa: PLC0415 (groups imports torch; --help must not)

    if args.initial_pipe_len is not None:
        raise CliInputError("--initial-pipe-len only applies to --layout pipetransformer")
    plan = plan_spmd(args.world_size, args.pipe_len, args.gpus_per_node)
    # the plan's group properties rebuild every group on each access: take them once
    pipeline_groups, dp_groups = plan.pipeline_groups, plan.dp_groups
    rows: list[dict[str, Any]] = [
        {
            "rank": r,
            "replica": plan.replica_of(r),
            "stage": plan.stage_of(r),
            "node": plan.node_of(r),
            "pipeline_group": list(pipeline_groups[plan.replica_of(r)]),
            "dp_group": list(dp_groups[plan.stage_of(r)]),
        }
        for r in range(plan.world_size)
    ]
    document = {
        "layout": "spmd",
        "world_size": plan.world_size,
        "pipe_len": plan.pipe_len,
        "replicas": plan.replicas,
        "gpus_per_node": plan.gpus_per_node,
        "ranks": rows,
        "pipeline_groups": [list(g) for g in pipeline_groups],
        "dp_groups": [list(g) for g in dp_groups],
    }
    k = plan.pipe_len
    lines = [
        f"SPMD layout: {plan.world_size} processes, one per device; pipeline length {k} means each pipeline "
        f"replica is cut into {k} stage{'s' if k != 1 else ''} on {k} device{'s' if k != 1 else ''}, so "
        f"{plan.replicas} replica{'s' if plan.replicas != 1 else ''} train side by side (data parallel).",
        "",
        f"{'rank':>4}  {'replica':>7}  {'stage':>5}  {'node':>4}  {'pipeline group':<24}data-parallel group",
    ]
    for row in rows:
        node = "-" if row["node"] is None else str(row["node"])
        lines.append(
            f"{row['rank']:>4}  {row['replica']:>7}  {row['stage']:>5}  {node:>4}  "
            f"{_ranks(row['pipeline_group']):<24}{_ranks(row['dp_group'])}"
        )
    emit(args, document, "\n".join(lines))
    return 0


def _pipetransformer(args: argparse.Namespace) -> int:
    from elastic_pipe.groups import plan_pipetransformer  # noqa: PLC0415 (see _spmd)

    if args.gpus_per_node is not None:
        raise CliInputError("--gpus-per-node only applies to --layout spmd")
    k0 = args.pipe_len if args.initial_pipe_len is None else args.initial_pipe_len
    plan = plan_pipetransformer(args.world_size, k0, args.pipe_len)
    document = {
        "layout": "pipetransformer",
        "world_size": plan.world_size,
        "initial_pipe_len": plan.initial_pipe_len,
        "pipe_len": plan.pipe_len,
        "replicas": plan.replicas,
        "active_ranks": list(plan.active_ranks),
        "new_ranks": list(plan.new_ranks),
    }
    k = plan.pipe_len
    new = (
        "none (this is the initial pipeline length)"
        if k == k0
        else f"{_ranks(plan.new_ranks)} (activated by going from pipeline length {2 * k} to {k})"
    )
    text = "\n".join(
        (
            f"PipeTransformer layout: {plan.world_size} processes started, one pipeline per active process.",
            f"Pipeline length {k} (initially {k0}): each active process drives a pipeline over {k} "
            f"device{'s' if k != 1 else ''}; {plan.replicas} pipeline replica{'s' if plan.replicas != 1 else ''}.",
            f"Active ranks: {_ranks(plan.active_ranks)}",
            f"Newly added ranks: {new}",
        )
    )
    emit(args, document, text)
    return 0


def run(args: argparse.Namespace) -> int:
    """Plan the layout and print it."""
    from elastic_pipe.groups.spmd import MAX_WORLD_SIZE  # noqa: PLC0415 (the groups import torch; --help must not)

    check_limit("--world-size", args.world_size, MAX_WORLD_SIZE, LIMIT_REASON)
    for flag, value in (("--pipe-len", args.pipe_len), ("--initial-pipe-len", args.initial_pipe_len)):
        if value is not None:
            check_limit(flag, value, MAX_WORLD_SIZE, "a pipeline cannot be longer than the largest world size")
    if args.gpus_per_node is not None:
        check_limit("--gpus-per-node", args.gpus_per_node, MAX_WORLD_SIZE, "no node has more devices than that")
    if args.layout == "spmd" and 1 <= args.pipe_len <= args.world_size:
        entries = args.world_size * (args.pipe_len + args.world_size // args.pipe_len)
        what = f"--world-size {args.world_size} with --pipe-len {args.pipe_len} lists W x (K + W/K) ="
        check_limit(what, entries, MAX_TABLE_ENTRIES, f"group entries; {LIMIT_REASON}")
    return _spmd(args) if args.layout == "spmd" else _pipetransformer(args)
