"""Plans as JSON-able data, a human table, and plots (throughput per epoch; pipeline/replica timeline)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from elastic_pipe.planner.errors import CHECK, PlannerError
from elastic_pipe.planner.job import INTERLEAVED_CHUNKS
from elastic_pipe.planner.result import EpochPlan, Plan
from elastic_pipe.planner.step import StepPrediction

__all__ = ["format_table", "plan_to_dict", "plot_throughput", "plot_timeline"]

_GIB = 1024**3
#: GPU rows drawn in the timeline.
TIMELINE_ROWS = 16


def _epoch_dict(e: EpochPlan) -> dict[str, Any]:
    b = e.step.breakdown
    alt = e.interleaved
    return {
        "epoch": e.epoch,
        "frozen": e.frozen,
        "cached": e.cached,
        "cache_tier": e.cache_tier,
        "pipe_len": e.pipe_len,
        "replicas": e.replicas,
        "virtual": e.virtual,
        "microbatches": e.step.microbatches,
        "micro_batch": e.step.micro_batch,
        "partition": {
            "layers_per_stage": list(e.step.layers_per_stage),
            "boundaries": list(e.boundaries),
            "stage_memory_gib": [m / _GIB for m in e.step.stage_memory],
        },
        "host_bound": e.step.host_bound,
        "step_time": e.step.step_time,
        "breakdown": {
            "compute": b.compute,
            "bubble": b.bubble,
            "transfers": b.transfers,
            "allreduce": b.allreduce,
            "cache_reads": b.cache_reads,
            "optimizer": b.optimizer,
            "host": b.host,
        },
        "throughput": e.throughput,
        "transition_seconds": e.transition_seconds,
        "seconds": e.seconds,
        "why": e.why,
        "interleaved": None
        if alt is None
        else {"virtual": alt.chunks, "step_time": alt.step_time, "bubble": alt.breakdown.bubble, "fits": alt.fits},
        "virtual_options": [
            {
                "virtual": p.chunks,
                "step_time": p.step_time,
                "bubble": p.breakdown.bubble,
                "bubble_fraction": p.breakdown.bubble_fraction,
                "fits": p.fits,
                "chosen": p.chunks == e.virtual,
            }
            for p in e.virtual_options
        ],
    }


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Everything in a plan as plain JSON-able data (the CLI's ``--json`` document)."""
    CHECK.instance("plan", plan, Plan)
    cluster = asdict(plan.cluster)
    job = asdict(plan.job)
    job["policy_options"] = dict(plan.job.policy_options)
    job["frozen"] = list(plan.job.frozen) if plan.job.frozen is not None else None
    static = plan.static[0]
    return {
        "model": plan.model,
        "units": plan.units,
        "layers": list(plan.layer_names),
        "cluster": cluster,
        "job": job,
        "epochs": [_epoch_dict(e) for e in plan.epochs],
        "static": {
            "pipe_len": static.pipe_len,
            "replicas": static.replicas,
            "microbatches": static.step.microbatches,
            "throughput": static.throughput,
            "seconds": plan.static_seconds,
            "epochs": [_epoch_dict(e) for e in plan.static[:1]],
        },
        "freeze_only": {
            "pipe_len": plan.freeze_only[0].pipe_len,
            "replicas": plan.freeze_only[0].replicas,
            "seconds": plan.freeze_only_seconds,
            "epochs": [_epoch_dict(e) for e in plan.freeze_only],
        },
        "seconds": plan.seconds,
        "speedup": plan.speedup,
        "speedup_over_freeze_only": plan.speedup_over_freeze_only,
        "transitions": plan.transitions,
        "reshapes": plan.reshapes,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _option(p: StepPrediction) -> str:
    """One v an ``"auto"`` epoch did not choose: its step and bubble."""
    fits = "" if p.fits else ", does not fit"
    return f"v={p.chunks}: {_ms(p.step_time)} ms, bubble {p.breakdown.bubble_fraction:.1%}{fits}"


def format_table(plan: Plan) -> str:
    """A human-readable table: one row per epoch, then the baselines and the speedups."""
    CHECK.instance("plan", plan, Plan)
    c, j = plan.cluster, plan.job
    lines = [
        f"{plan.model} on {c.gpus} GPUs ({c.gpus_per_node} per node, {c.gpu.memory / _GIB:.0f} GiB each), "
        f"global batch {j.global_batch}, {j.epochs} epochs x {j.steps_per_epoch} steps, schedule {j.schedule}, "
        f"cache {'on' if j.cache else 'off'}",
        "",
        f"{'epoch':>5} {'frozen':>6} {'cache':>9} {'K':>3} {'v':>2} {'R':>4} {'M':>3} {'step ms':>8} {'compute':>8} "
        f"{'bubble':>7} {'xfer':>6} {'allred':>7} {'cache':>6} {'opt+host':>8} {'samples/s':>10}  stages (sub-layers)",
    ]
    for e in plan.epochs:
        b = e.step.breakdown
        cache = f"{e.cached}@{e.cache_tier}" if e.cache_tier else "-"
        host = " host-bound" if e.step.host_bound else ""
        moved = f"  [transition {e.transition_seconds:.3g} s]" if e.transition_seconds else ""
        alt = e.interleaved
        if alt is not None:
            moved += f"  [v={alt.chunks}: {_ms(alt.step_time)} ms, bubble {_ms(alt.breakdown.bubble)}]"
        others = [p for p in e.virtual_options if p.chunks != e.virtual]
        if others:
            moved += "  [" + "; ".join(_option(p) for p in others) + "]"
        lines.append(
            f"{e.epoch:>5} {e.frozen:>6} {cache:>9} {e.pipe_len:>3} {e.virtual:>2} {e.replicas:>4} "
            f"{e.step.microbatches:>3} "
            f"{_ms(e.step.step_time):>8} {_ms(b.compute):>8} {_ms(b.bubble):>7} {_ms(b.transfers):>6} "
            f"{_ms(b.allreduce):>7} {_ms(b.cache_reads):>6} {_ms(b.optimizer + b.host):>8} {e.throughput:>10,.0f}  "
            f"{'/'.join(str(n) for n in e.step.layers_per_stage)}{host}{moved}"
        )
    notes = [
        f"  epoch {e.epoch}: {e.why}"
        for i, e in enumerate(plan.epochs)
        if e.why and (i == 0 or (e.frozen, e.pipe_len) != (plan.epochs[i - 1].frozen, plan.epochs[i - 1].pipe_len))
    ]
    if any(e.interleaved is not None for e in plan.epochs):
        lines += [
            "",
            f"[v={INTERLEAVED_CHUNKS}: ...] the same K and M predicted with {INTERLEAVED_CHUNKS} interleaved stages "
            "per rank (plan and train it with --schedule interleaved --virtual 2, [pipeline] virtual = 2)",
        ]
    if any(e.virtual_options for e in plan.epochs):
        lines += [
            "",
            f"virtual = auto: v is the fastest of {', '.join(str(v) for v in j.virtual_candidates)} at each epoch's K "
            "and M that fits memory; [v=...: step ms, bubble] the others",
        ]
    if notes:
        lines += ["", "transitions:", *notes]
    s, f = plan.static[0], plan.freeze_only[0]
    lines += [
        "",
        f"static baseline:      K={s.pipe_len} x {s.replicas} replicas, M={s.step.microbatches}, "
        f"{s.throughput:,.0f} samples/s, {plan.static_seconds:,.1f} s",
        f"freeze-only baseline: K={f.pipe_len} x {f.replicas} replicas kept, {plan.freeze_only_seconds:,.1f} s",
        f"elastic:              {plan.seconds:,.1f} s, {plan.transitions} transitions ({plan.reshapes} reshapes)",
        f"speedup: {plan.speedup:.2f}x over static, {plan.speedup_over_freeze_only:.2f}x over freeze-only",
    ]
    return "\n".join(lines)


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure with an Agg canvas (no pyplot global state); matplotlib is an optional extra."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - matplotlib is in the test extra
        raise PlannerError("plots need matplotlib: pip install 'elastic-pipe[plots]'") from exc
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def plot_throughput(plan: Plan, path: str | Path) -> Path:
    """Throughput per epoch of the elastic job and both baselines, as a PNG."""
    CHECK.instance("plan", plan, Plan)
    CHECK.instance("path", path, str | Path)
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    x = [e.epoch for e in plan.epochs]
    ax.plot(x, [e.throughput for e in plan.epochs], "o-", label=f"elastic ({plan.speedup:.2f}x)")
    ax.plot(x, [e.throughput for e in plan.freeze_only], "s--", label="freeze-only")
    ax.plot(x, [e.throughput for e in plan.static], "k:", label="static")
    ax.set_xlabel("epoch")
    ax.set_ylabel("samples / s")
    ax.set_yscale("log")
    ax.set_title(f"{plan.model}, {plan.cluster.gpus} GPUs: predicted throughput")
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    return out


def plot_timeline(plan: Plan, path: str | Path) -> Path:
    """The layout per epoch: each GPU's role (stage, or idle) per epoch, replicas side by side, as a PNG."""
    CHECK.instance("plan", plan, Plan)
    CHECK.instance("path", path, str | Path)
    from matplotlib import colormaps  # noqa: PLC0415 - optional extra, checked by _figure

    gpus = plan.cluster.gpus
    shown = min(gpus, TIMELINE_ROWS)  # more rows would not be readable; the layout repeats per replica anyway
    fig = _figure(8, 0.3 * shown + 1.8)
    ax = fig.add_subplot()
    cmap = colormaps["tab10"]
    for e in plan.epochs:
        for rank in range(shown):
            stage = rank % e.pipe_len
            ax.barh(rank, 1.0, left=e.epoch, color=cmap(stage % cmap.N), edgecolor="white", linewidth=0.5)
        ax.text(e.epoch + 0.5, -0.8, f"K={e.pipe_len}\nR={e.replicas}", ha="center", va="bottom", fontsize=7)
    ax.set_xlim(0, len(plan.epochs))
    ax.set_yticks(range(0, shown, max(1, shown // 8)))
    ax.set_ylim(shown - 0.5, -2.2)
    ax.set_xlabel("epoch (colour: the pipeline stage a GPU holds; a replica is K consecutive ranks)")
    ax.set_ylabel("GPU rank" + (f" (first {shown} of {gpus})" if shown < gpus else ""))
    ax.set_title(f"{plan.model}: pipeline length and replicas per epoch")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    return out
