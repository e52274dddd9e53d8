"""Dry-run an elastic training job: per-epoch layout, step-time breakdown and the speedup over static training.

Examples::

    elastic-pipe plan --model vit-b16 --gpus 16 --gpus-per-node 8 --gpu-memory 16GiB --alpha 0.3333 --epochs 10
    elastic-pipe plan --model gpt2-xl --gpus 64 --gpu-memory 80GB --pipe-len 8 --json
    elastic-pipe plan --costs measured.json --costs-batch 32 --gpus 8 --plot plots/
    elastic-pipe plan --config run.toml    # the layouts a training config runs, with v, step time and bubble

Defaults describe H200 GPUs as measured on the lent machine (141 GB, achieved 490 TFLOP/s in matrix multiplies,
~1 ms of eager host time per block, micro-batch and pass, NVLink 300 GB/s, 45 us per message) with one 400 Gb/s
NIC per GPU between nodes (assumed). The JSON document holds "epochs" (per epoch "frozen", "pipe_len",
"replicas", "microbatches", "throughput", "partition" and the step-time "breakdown"), "speedup",
"speedup_over_freeze_only" and "transitions".
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_pipe.cli._common import (
    CliInputError,
    add_json_flag,
    check_limit,
    emit,
    first_non_finite,
    read_json_file,
)
from elastic_pipe.types import LayerCost

if TYPE_CHECKING:
    from elastic_pipe.orchestrator import TrainConfig
    from elastic_pipe.planner import ClusterSpec, GpuSpec, Plan

HELP = "Dry-run an elastic training job and predict its speedup over a static baseline."

#: Samples per epoch when not given: ImageNet-1k's training set (the published ViT experiments).
DEFAULT_DATASET_SIZE = 1_281_167
#: Samples per GPU of the default global batch.
DEFAULT_BATCH_PER_GPU = 64
_GB = 1e9

#: The upper bounds on the job's sizes are the planner's own (``MAX_GPUS``, ``MAX_EPOCHS``, ``MAX_MICROBATCHES``,
#: ``MAX_PIPE_LEN`` of :mod:`elastic_pipe.planner.cluster` and :mod:`elastic_pipe.planner.job`), checked here first
#: so that a too-large value is one line naming the flag.
LIMIT_REASON = "the planner prices every layout of every epoch; larger jobs would take hours"


def _gpu_defaults() -> GpuSpec:
    from elastic_pipe.planner import GpuSpec  # noqa: PLC0415 (the planner imports torch; --help must not)

    return GpuSpec()


def _rate_options() -> tuple[tuple[str, float, str], ...]:
    """The cluster group's float options that default to the H200 specs, in the option's unit: (flag, default,
    help), in the order ``--help`` lists them. :func:`build` converts each back to the spec's SI unit."""
    from elastic_pipe.planner import ClusterSpec  # noqa: PLC0415 (see _gpu_defaults)

    gpu, cluster = _gpu_defaults(), ClusterSpec(1)
    return (
        (
            "--gpu-tflops",
            gpu.matmul_flops / 1e12,
            f"achieved matmul TFLOP/s per GPU (default {gpu.matmul_flops / 1e12:g}); attention and conv "
            "rates scale with it",
        ),
        (
            "--memory-bandwidth",
            gpu.memory_bandwidth / _GB,
            f"achieved GPU memory GB/s (default {gpu.memory_bandwidth / _GB:g})",
        ),
        (
            "--host-overhead-ms",
            gpu.host_overhead * 1e3,
            "eager host ms per block, micro-batch and pass (default 1; 0 for CUDA graphs / compiled)",
        ),
        ("--intra-bw", cluster.intra_node_bandwidth / _GB, "GB/s between GPUs of a node (default 300)"),
        ("--inter-bw", cluster.inter_node_bandwidth / _GB, "GB/s per GPU between nodes (default 50)"),
        (
            "--p2p-latency-us",
            cluster.p2p_latency * 1e6,
            "fixed microseconds per point-to-point message (default 45)",
        ),
        ("--host-bw", cluster.host_bandwidth / _GB, "GB/s pinned host -> GPU, the host cache tier (default 55)"),
        ("--disk-bw", cluster.disk_bandwidth / _GB, "GB/s per GPU from the disk cache tier (default 5)"),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    from elastic_pipe.planner import CACHE_FILLS, CACHE_TIERS, MODEL_CONFIGS  # noqa: PLC0415 (see _gpu_defaults)
    from elastic_pipe.schedule import GENERATORS  # noqa: PLC0415 (see _gpu_defaults)

    what = parser.add_argument_group("model (one of)")
    what.add_argument(
        "--config",
        metavar="FILE.toml",
        help="a training config: print the per-epoch layouts `elastic-pipe train --config` will run, each with its "
        "stages per rank v ([pipeline] virtual) and its step and bubble predicted under [pipeline] schedule on the "
        "cluster the options describe",
    )
    what.add_argument("--model", help=f"a built-in config: {', '.join(MODEL_CONFIGS)}")
    what.add_argument(
        "--costs",
        help='measured costs: JSON {"layers": [LayerCost fields...], "unit_ends": [...] (optional)} or a list',
    )
    what.add_argument("--costs-batch", type=int, default=1, help="micro-batch size the --costs were measured at")
    what.add_argument(
        "--costs-host-weight",
        type=float,
        default=0.0,
        help="eager host work per --costs layer, in blocks (0: CPU timings include it; 0.5 for GPU-timed sub-layers)",
    )
    what.add_argument("--seq-len", type=int, help="sequence length of a text model (default: its published one)")

    hw = parser.add_argument_group("cluster (H200-like defaults)")
    hw.add_argument("--gpus", type=int, help="GPU count W (required with --model or --costs)")
    hw.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    hw.add_argument("--gpu-memory", default="141GB", help="memory per GPU, e.g. 16GiB or 80GB (default 141GB)")
    hw.add_argument(
        "--reserved-memory",
        help="memory per GPU a plan never fills: context, allocator, workspaces (default 2GiB, at most 1/8 of the GPU)",
    )
    for flag, default, text in _rate_options():
        hw.add_argument(flag, type=float, default=default, help=text)
    hw.add_argument("--host-cache-memory", default="1TiB", help="host memory per node for the cache (default 1TiB)")

    job = parser.add_argument_group("job")
    job.add_argument("--global-batch", type=int, help=f"samples per step (default {DEFAULT_BATCH_PER_GPU} x GPUs)")
    job.add_argument("--epochs", type=int, default=10, help="epochs (default 10)")
    job.add_argument("--dataset-size", type=int, default=DEFAULT_DATASET_SIZE, help="samples per epoch")
    job.add_argument("--steps-per-epoch", type=int, help="steps per epoch (default dataset-size / global-batch)")
    job.add_argument("--policy", default="alpha", choices=["alpha", "freezeout", "manual", "never"])
    job.add_argument("--alpha", default="1/3", help="alpha policy: e.g. 0.3333 or 1/3 (default 1/3)")
    job.add_argument("--t0", type=float, default=0.5, help="freezeout policy: t0 (default 0.5)")
    job.add_argument("--manual", help="manual policy: EPOCH:FROZEN pairs, e.g. 2:4,5:8")
    job.add_argument("--pipe-len", type=int, help="initial pipeline length (default: the fastest that fits)")
    job.add_argument("--schedule", default="1f1b", choices=sorted(GENERATORS), help="pipeline schedule")
    job.add_argument(
        "--virtual",
        type=_virtual,
        help="stages per rank v (default: 2 for interleaved, else 1; 1f1b and zb1p take 1, gpipe 1 or more), or "
        "'auto': each epoch plans the fastest v the schedule runs and lists the others' step and bubble",
    )
    job.add_argument("--microbatches", type=int, help="fixed micro-batches per step (default: tuned in [K, 6K])")
    job.add_argument("--no-cache", action="store_true", help="recompute the frozen prefix instead of caching it")
    job.add_argument("--cache-tier", default="auto", choices=["auto", *CACHE_TIERS])
    job.add_argument(
        "--cache-fill",
        default="epoch",
        choices=list(CACHE_FILLS),
        help="when a new cache boundary fills: during its first epoch (published, default) or in the transition, "
        "for the whole training set (elastic-pipe train)",
    )
    job.add_argument("--transition-seconds", type=float, default=5.0, help="cost of one reshape (default 5 s)")
    job.add_argument("--solver", default="optimal", help="partition solver (default optimal)")

    add_json_flag(parser)
    parser.add_argument("--plot", metavar="DIR", help="write planner_throughput.png and planner_timeline.png here")


def _costs_from_file(path: str, batch: int, host_weight: float) -> tuple[str, Any]:
    from elastic_pipe.planner import from_layer_costs  # noqa: PLC0415 (see _gpu_defaults)

    data = read_json_file(path)
    rows = data.get("layers") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows:
        raise CliInputError(f'{path}: expected a non-empty list of layers or {{"layers": [...]}}')
    try:
        records = [LayerCost(**row) for row in rows]
    except TypeError as exc:
        raise CliInputError(f"{path}: a layer has an unknown or missing field: {exc}") from None
    ends = data.get("unit_ends") if isinstance(data, dict) else None
    return Path(path).stem, from_layer_costs(records, batch, ends, host_weight=host_weight)


def _policy_options(args: argparse.Namespace, steps: int) -> dict[str, Any]:
    from elastic_pipe.freeze import parse_manual  # noqa: PLC0415 (see _gpu_defaults)

    if args.policy == "alpha":
        try:
            return {"alpha": float(Fraction(str(args.alpha).strip()))}
        except (ValueError, ZeroDivisionError):
            raise CliInputError(f"--alpha {args.alpha!r} is not a number or a fraction like 1/3") from None
    if args.policy == "freezeout":
        return {"t0": args.t0, "total_steps": args.epochs * steps}
    if args.policy == "manual":
        if not args.manual:
            raise CliInputError("--policy manual needs --manual EPOCH:FROZEN,...")
        return {"schedule": parse_manual(args.manual)}
    return {}


def cluster_from_args(args: argparse.Namespace, gpus: int) -> ClusterSpec:
    """The cluster the options describe, with ``gpus`` GPUs (``--gpus``, or a config's world size)."""
    from elastic_pipe.planner import ClusterSpec, GpuSpec, parse_bytes  # noqa: PLC0415 (see _gpu_defaults)

    defaults = _gpu_defaults()
    scale = args.gpu_tflops * 1e12 / defaults.matmul_flops
    if not (math.isfinite(scale) and scale > 0):
        raise CliInputError(f"--gpu-tflops must be a finite number > 0, got {args.gpu_tflops}")
    memory = parse_bytes(args.gpu_memory)
    gpu = GpuSpec(
        memory=memory,
        reserved_memory=min(defaults.reserved_memory, memory // 8)
        if args.reserved_memory is None
        else parse_bytes(args.reserved_memory),
        matmul_flops=defaults.matmul_flops * scale,
        attention_flops=defaults.attention_flops * scale,
        conv_flops=defaults.conv_flops * scale,
        memory_bandwidth=args.memory_bandwidth * _GB,
        host_overhead=args.host_overhead_ms / 1e3,
    )
    return ClusterSpec(
        gpus=gpus,
        gpus_per_node=args.gpus_per_node,
        gpu=gpu,
        intra_node_bandwidth=args.intra_bw * _GB,
        inter_node_bandwidth=args.inter_bw * _GB,
        p2p_latency=args.p2p_latency_us / 1e6,
        host_bandwidth=args.host_bw * _GB,
        disk_bandwidth=args.disk_bw * _GB,
        host_cache_memory=parse_bytes(args.host_cache_memory),
    )


def build(args: argparse.Namespace) -> Plan:
    """Turn parsed arguments into a plan (separate from :func:`run` so tests and scripts can call it)."""
    from elastic_pipe.planner import (  # noqa: PLC0415 (see _gpu_defaults)
        JobSpec,
        make_plan,
        model_config,
        model_work,
        plan_to_dict,
        price,
    )
    from elastic_pipe.planner.cluster import MAX_GPUS  # noqa: PLC0415 (see _gpu_defaults)
    from elastic_pipe.planner.job import MAX_EPOCHS, MAX_MICROBATCHES, MAX_PIPE_LEN  # noqa: PLC0415 (likewise)

    if (args.model is None) == (args.costs is None):
        raise CliInputError("give exactly one of --model NAME or --costs FILE")
    if args.gpus is None:
        raise CliInputError("--model and --costs need --gpus W (the GPU count)")
    if args.gpus < 1:
        raise CliInputError(f"--gpus must be >= 1, got {args.gpus}")
    check_limit("--gpus", args.gpus, MAX_GPUS, LIMIT_REASON)
    check_limit("--epochs", args.epochs, MAX_EPOCHS, LIMIT_REASON)
    if args.microbatches is not None:
        check_limit("--microbatches", args.microbatches, MAX_MICROBATCHES, LIMIT_REASON)
    if args.pipe_len is not None:
        check_limit("--pipe-len", args.pipe_len, MAX_PIPE_LEN, LIMIT_REASON)
    cluster = cluster_from_args(args, args.gpus)
    batch = args.global_batch if args.global_batch is not None else DEFAULT_BATCH_PER_GPU * args.gpus
    if batch < 1 or args.dataset_size < 1:
        raise CliInputError(f"--global-batch and --dataset-size must be >= 1, got {batch}, {args.dataset_size}")
    steps = args.steps_per_epoch if args.steps_per_epoch is not None else max(1, -(-args.dataset_size // batch))
    job = JobSpec(
        global_batch=batch,
        epochs=args.epochs,
        steps_per_epoch=steps,
        policy=args.policy,
        policy_options=_policy_options(args, steps),
        pipe_len=args.pipe_len,
        schedule=args.schedule,
        microbatches=args.microbatches,
        cache=not args.no_cache,
        cache_tier=args.cache_tier,
        cache_fill=args.cache_fill,
        dataset_size=args.dataset_size,
        transition_seconds=args.transition_seconds,
        solver=args.solver,
        virtual=args.virtual,
    )
    if args.model is not None:
        config = model_config(args.model)
        if args.seq_len is not None:
            config = config.with_seq_len(args.seq_len)
        name, costs = config.name, price(model_work(config), cluster.gpu)
    else:
        name, costs = _costs_from_file(args.costs, args.costs_batch, args.costs_host_weight)
    try:
        plan = make_plan(costs, cluster, job, model=name)
    except OverflowError as exc:
        raise CliInputError(f"the options overflow the float range ({exc}); {_EXTREME}") from None
    found = first_non_finite(plan_to_dict(plan))
    if found is not None:
        raise CliInputError(f"the plan's {found}: an option overflows the float range; {_EXTREME}")
    return plan


#: What to check when the planner's arithmetic overflows.
_EXTREME = "use realistic values for the rates, times and sizes (e.g. --host-overhead-ms 1e308 or --intra-bw 1e-308)"


def _virtual(text: str) -> int | str:
    """``--virtual``: a stage count, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a stage count or 'auto', got {text!r}") from None


def render_layouts(epochs: list[dict[str, Any]]) -> str:
    """The table of a training config's per-epoch layouts, each with its predicted step and bubble."""
    lines = ["epoch  frozen units  frozen sub-layers  K  v  R  M  step ms  bubble  boundaries"]
    for e in epochs:
        step = e["predicted"]
        lines.append(
            f"{e['epoch'] + 1:>5}  {e['frozen_units']:>12}  {e['frozen']:>17}  {e['pipe_len']}  {e['virtual']}  "
            f"{e['replicas']}  {e['microbatches']}  {step['step_time'] * 1e3:>7.3g}  {step['bubble_fraction']:>6.1%}  "
            f"{e['boundaries']}"
        )
    return "\n".join(lines)


def _example(data: Any) -> Any:
    """One sample of a config's data as a batch of one: held in memory, or a dataset's first item."""
    import torch  # noqa: PLC0415 (see _gpu_defaults)

    from elastic_pipe.orchestrator.data import is_samples  # noqa: PLC0415

    return data.inputs[:1] if is_samples(data) else torch.as_tensor(data[0][0]).unsqueeze(0)


def predict_config(config: TrainConfig, cluster: ClusterSpec | None = None) -> list[dict[str, Any]]:
    """Per epoch of ``config``: the layout the trainer's rule chooses (``planned_epochs``), its stages per rank
    ``"virtual"`` and ``"predicted"``, the planner's step of that layout under ``[pipeline] schedule`` on
    ``cluster`` (``step_time``, ``bubble``, ``bubble_fraction`` and the ``breakdown``).

    Sub-layers are priced by their FLOPs (:func:`elastic_pipe.planner.model_costs`); the frozen prefix is read from
    a device cache unless ``[pipeline] cache = "off"`` (``"auto"`` is priced as ``"on"``).

    Args:
        config: the training config.
        cluster: the GPUs; default H200-like ones, as many as the config's world size.

    Raises:
        ConfigError: as :func:`elastic_pipe.orchestrator.dry_run.planned_epochs`.
    """
    from elastic_pipe.orchestrator import components_from_config  # noqa: PLC0415
    from elastic_pipe.orchestrator.dry_run import planned_epochs  # noqa: PLC0415
    from elastic_pipe.planner import ClusterSpec, model_costs, predict_layout  # noqa: PLC0415
    from elastic_pipe.types import Layout  # noqa: PLC0415

    cluster = cluster if cluster is not None else ClusterSpec(config.world_size)
    parts = components_from_config(config)
    device = next(parts.model.parameters()).device
    costs = model_costs(parts.model, _example(parts.data).to(device), cluster.gpu)
    rows: list[dict[str, Any]] = planned_epochs(config)
    out = []
    for row in rows:
        keys = ("frozen", "pipe_len", "replicas", "boundaries", "microbatches", "virtual")
        frozen, pipe_len, replicas, boundaries, microbatches, v = (row[k] for k in keys)
        layout = Layout(frozen, pipe_len, replicas, tuple(boundaries), microbatches, virtual=v)
        step = predict_layout(
            costs,
            cluster,
            layout,
            schedule=config.pipeline.schedule,
            global_batch=config.train.global_batch,
            cached=config.pipeline.cache != "off",
        )
        b = step.breakdown
        predicted = {
            "step_time": step.step_time,
            "bubble": b.bubble,
            "bubble_fraction": b.bubble_fraction,
            "breakdown": {
                "compute": b.compute,
                "bubble": b.bubble,
                "transfers": b.transfers,
                "cache_reads": b.cache_reads,
                "allreduce": b.allreduce,
                "optimizer": b.optimizer,
                "host": b.host,
            },
        }
        out.append({**row, "predicted": predicted})
    return out


def render_decisions(decisions: list[dict[str, Any]]) -> str:
    """The table of a config's decision points (``[freeze] decide_every``): where each falls and what it chose."""
    lines = ["step  epoch  after step  frozen units  K  R  M  boundaries"]
    for d in decisions:
        mark = "" if d["changed"] else "  (unchanged)"
        lines.append(
            f"{d['step']:>4}  {d['epoch'] + 1:>5}  {d['epoch_step']:>10}  {d['frozen_units']:>12}  {d['pipe_len']}  "
            f"{d['replicas']}  {d['microbatches']}  {d['boundaries']}{mark}"
        )
    return "\n".join(lines)


def run_config(args: argparse.Namespace) -> int:
    """``plan --config``: the layouts the training config leads to, decided by the trainer's own rule."""
    from elastic_pipe.orchestrator import load_config  # noqa: PLC0415
    from elastic_pipe.orchestrator.dry_run import planned_decisions  # noqa: PLC0415

    if args.model is not None or args.costs is not None:
        raise CliInputError("give exactly one of --config FILE, --model NAME or --costs FILE")
    config = load_config(args.config)
    cluster = cluster_from_args(args, config.world_size)
    epochs = predict_config(config, cluster)
    p = config.pipeline
    doc: dict[str, Any] = {"config": args.config, "schedule": p.schedule, "virtual": p.virtual, "epochs": epochs}
    per_rank = "chosen per layout by the layout rule" if p.virtual == "auto" else "stage(s) per rank"
    text = (
        f"schedule {p.schedule}, v = {p.virtual} {per_rank}; steps predicted on {cluster.gpus} GPUs "
        f"({args.gpu_tflops:g} TFLOP/s, {args.host_overhead_ms:g} ms host per block and pass; sub-layers priced "
        "by their FLOPs)\n" + render_layouts(epochs)
    )
    decisions = planned_decisions(config)
    if decisions:  # decision points inside epochs ([freeze] decide_every): list them too
        doc["decisions"] = decisions
        text += "\n\n" + render_decisions(decisions)
    emit(args, doc, text)
    return 0


def run(args: argparse.Namespace) -> int:
    """Plan the job and print the table (or JSON); write plots on request."""
    from elastic_pipe.planner import format_table, plan_to_dict, plot_throughput, plot_timeline  # noqa: PLC0415

    if args.config is not None:
        return run_config(args)
    plan = build(args)
    text = format_table(plan)
    if args.plot:
        folder = Path(args.plot)
        folder.mkdir(parents=True, exist_ok=True)
        for path in (
            plot_throughput(plan, folder / "planner_throughput.png"),
            plot_timeline(plan, folder / "planner_timeline.png"),
        ):
            text += f"\nwrote {path}"
    emit(args, plan_to_dict(plan), text)
    return 0
