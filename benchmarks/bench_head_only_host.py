"""Where a head-only step's host time goes: our trainer loop, per component, on the CPU with a negligible head.

    python benchmarks/bench_head_only_host.py                        # -> benchmarks/results/head_only_host.json
    PYTHONPATH=/path/to/other/checkout/src python benchmarks/bench_head_only_host.py --label main --out B.json
    python benchmarks/bench_head_only_host.py --compare A.json B.json --out C.json   # before/after, one file

A head-only step (every block frozen, the boundary activations read from the activation cache, only the head
trains) does about 0.8 ms of GPU work for ViT-B/16 at batch 512 on an H200, but took 2.2-3.7 ms per step there:
the host sets the pace. This script runs the real trainer (``run_rank``: the elastic sampler, the data path, the
prefix cache with its look-ahead, the step loop, AdamW, the scheduler, the freeze tracker, the phase clocks) on a
ViT whose blocks and head are so narrow (width 16, 10 classes) that compute is negligible, so a step's time on the
CPU is its host time. A manual policy freezes every block after epoch 0; the epochs after the first head-only one
(which carries the cache fill and the layout's warm-up) are the ones measured.

How the time is split. Every call the step loop makes at a component's boundary is wrapped by a timer
(``time.perf_counter``) that keeps *exclusive* time: a wrapped call inside another (the cache prefetch inside the
batch iterator, say) is charged to its own component and taken out of its caller's. The components:

* ``batch_sampler``: the elastic sampler's indices for the step (``ElasticBatchSampler``);
* ``batch_assembly``: a step's index tensor, its label (and input) gather (``Split.batches``);
* ``cache_prefetch``: the next step's cache lookup started a step ahead (``PrefetchedBatches`` and the cache's
  ``prefetch``);
* ``cache_read``: the step's lookup taken and turned into the stage's input (``FrozenPrefix.forward``);
* ``forward_backward``: the head's forward, loss and backward (``StageRuntime.run``), the launch cost on a GPU;
* ``loss``: keeping the step's loss on the device for the epoch's reduction;
* ``optimizer``, ``lr_scheduler``, ``zero_grad``: ``optimizer.step()`` (AdamW, fused as on the GPU),
  ``scheduler.step()``, the gradients' reset;
* ``grad_sync`` (0 with one replica), ``grad_clip`` (only with ``--max-grad-norm``);
* ``freeze_stats``: the freeze policy's gradient statistics (``GradNormTracker.accumulate``);
* ``reseed``: the per-step ``torch.manual_seed(step_seed(...))``;
* ``timing``: the phase clock and the forward timer's hooks;
* ``progress``: the progress bar's update;
* ``bookkeeping``: the sampler's ``advance``, the run state's ``replace`` and the fault hook;
* ``loop_other``: the rest of the epoch's seconds per step (the loop's own lines, the wrappers' overhead).

The wrappers cost about a microsecond each; ``plain_step_ms`` (a second run without them) is the step time to
quote, ``instrumented_step_ms`` the one the components add up to. Each arm reports the fastest of ``--repeats``
runs, the components of its fastest instrumented run (the machine is shared and interference only adds: under
load even CPU time grows, by cache and core sharing), and every run's numbers. On a GPU some host costs differ
(kernel launches are asynchronous; CUDA events and device synchronisations at timed steps; pinned copies): the
CPU breakdown shows the Python and dispatcher work per step, which a GPU step pays as well.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import re
import socket
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import elastic_pipe
from elastic_pipe import freeze, models
from elastic_pipe.orchestrator import config_from_tables, trainer
from elastic_pipe.orchestrator import step_loop as loop
from elastic_pipe.orchestrator.data import ElasticBatchSampler, Split
from elastic_pipe.orchestrator.prefix import FrozenPrefix
from elastic_pipe.orchestrator.prefix import reads as prefix_reads
from elastic_pipe.orchestrator.report import PhaseClock, Progress
from elastic_pipe.orchestrator.stage import StageRuntime
from elastic_pipe.orchestrator.stage.forward_timer import ForwardTimer

#: The arguments the JSON records.
SETTINGS = ("depth", "batch", "steps", "epochs", "repeats", "max_grad_norm", "optimizer", "threads")

RESULTS = Path(__file__).resolve().parent / "results" / "head_only_host.json"

#: The components, in the order they are reported.
COMPONENTS = (
    "batch_sampler",
    "batch_assembly",
    "cache_prefetch",
    "cache_read",
    "forward_backward",
    "loss",
    "optimizer",
    "lr_scheduler",
    "zero_grad",
    "grad_sync",
    "grad_clip",
    "freeze_stats",
    "reseed",
    "timing",
    "progress",
    "bookkeeping",
    "loop_other",
)

#: The GPU numbers the CPU breakdown explains (one H200, torch 2.11, ViT-B/16, batch 512, bf16, fused AdamW,
#: alpha = 1/3 + cache; ``benchmarks/gpu/bench_single_gpu.py``, docs/benchmarks.md).
GPU_REFERENCE_MS = {"head_only_gpu_ms": 0.80, "eager": 3.74, "cuda_graphs": 2.84, "compiled_graphs": 2.25}


#: The clock of every measurement: this thread's CPU seconds, which a shared machine's other work does not inflate
#: (wall time does, by whatever preempts the process); the step loop runs on this thread and does not block on the
#: CPU, so its CPU time is its host time.
CLOCK = time.thread_time


class Probe:
    """Exclusive wall time per component over the calls it wraps, while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []  # per open call: seconds its wrapped callees took
        self._undo: list[Callable[[], None]] = []

    def timed(self, component: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its exclusive seconds charged to ``component``."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            self._stack.append(0.0)
            t0 = CLOCK()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = CLOCK() - t0
                inner = self._stack.pop()
                self.seconds[component] += spent - inner
                if self._stack:
                    self._stack[-1] += spent

        return wrapper

    def timed_iter(self, component: str, it: Iterator[Any]) -> Iterator[Any]:
        """``it`` with each ``next`` timed as a call."""
        step = self.timed(component, lambda: next(it, _END))
        while True:
            item = step()
            if item is _END:
                return
            yield item

    def patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` by ``make(original)`` until :meth:`restore`."""
        had = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))

        def undo() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def method(self, cls: Any, name: str, component: str) -> None:
        """Time every call of ``cls.name``."""
        self.patch(cls, name, lambda f: self.timed(component, f))

    def iterator(self, cls: Any, name: str, component: str) -> None:
        """Time every ``next`` of the iterators ``cls.name(...)`` returns."""
        self.patch(cls, name, lambda f: lambda *a, **k: self.timed_iter(component, iter(f(*a, **k))))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


_END = object()


def instrument(probe: Probe) -> None:
    """Wrap the step loop's calls at each component's boundary (see the module docstring)."""
    probe.iterator(ElasticBatchSampler, "__iter__", "batch_sampler")
    probe.iterator(Split, "batches", "batch_assembly")
    probe.method(prefix_reads.PrefetchedBatches, "__next__", "cache_prefetch")
    probe.method(FrozenPrefix, "forward", "cache_read")
    probe.method(StageRuntime, "run", "forward_backward")
    probe.method(StageRuntime, "grad_sync", "grad_sync")
    probe.method(freeze.GradNormTracker, "accumulate", "freeze_stats")
    probe.patch(loop, "clip_global_grad_norm", lambda f: probe.timed("grad_clip", f))
    probe.patch(loop, "step_seed", lambda f: probe.timed("reseed", f))
    probe.patch(torch, "manual_seed", lambda f: probe.timed("reseed", f))
    probe.patch(loop, "maybe_fail", lambda f: probe.timed("bookkeeping", f))
    for name in ("start", "lap"):
        probe.method(PhaseClock, name, "timing")
    for name in ("_begin", "_end", "collect"):
        probe.method(ForwardTimer, name, "timing")
    probe.method(Progress, "update", "progress")
    if hasattr(loop, "RunState"):  # a step loop that replaced the run state at every step
        probe.method(loop.RunState, "replace", "bookkeeping")
    if hasattr(loop, "_zero_grad"):  # zero_grad as the loop's own loop over the parameters
        probe.patch(loop, "_zero_grad", lambda f: lambda opt: probe.timed("zero_grad", f(opt)))
    if hasattr(loop, "step_loss"):  # the loss kept per step, where the loop has it as a function
        probe.patch(loop, "step_loss", lambda f: probe.timed("loss", f))
    else:  # the loss line inline: its stack and mean
        probe.patch(torch, "stack", lambda f: probe.timed("loss", f))

    def begin(epoch: int, kw: dict[str, Any]) -> Callable[[], dict[str, float]]:
        opt, sched, sampler = kw["optimizer"], kw["scheduler"], kw["sampler"]
        local = Probe()  # the run's own objects, patched for this epoch
        local.patch(opt, "step", lambda f: probe.timed("optimizer", f))
        local.patch(opt, "zero_grad", lambda f: probe.timed("zero_grad", f))
        local.patch(sched, "step", lambda f: probe.timed("lr_scheduler", f))
        local.patch(sampler, "advance", lambda f: probe.timed("bookkeeping", f))
        before = dict(probe.seconds)
        probe.on = True

        def end() -> dict[str, float]:
            probe.on = False
            local.restore()
            return {k: v - before.get(k, 0.0) for k, v in probe.seconds.items()}

        return end

    probe.epochs = []  # type: ignore[attr-defined]
    watch_epochs(probe, begin)


def watch_epochs(probe: Probe, begin: Callable[[int, dict[str, Any]], Callable[[], dict[str, float]]]) -> None:
    """Time every epoch's step loop, from its start to its end (its reductions included), on this thread's CPU
    clock: ``begin(epoch, kw)`` runs as an epoch starts (``kw``: the loop's ``optimizer``, ``scheduler`` and
    ``sampler``) and returns what runs as it ends; the epoch's record, with what that returns, goes to
    ``probe.epochs``. For a checkout whose step loop is one call per epoch (``trainer.run_epoch``) and for one
    whose trainer drives an ``EpochRun`` from its start to its ``finish``.
    """

    def record(frozen: int, steps: int, seconds: float, cpu: float, extra: dict[str, float]) -> None:
        row = {"layout_frozen": frozen, "steps": steps, "seconds": seconds, "cpu_s": cpu, **extra}
        probe.epochs.append(row)  # type: ignore[attr-defined]

    if hasattr(trainer, "run_epoch"):
        original = trainer.run_epoch

        def run_epoch(ctx: Any, state: Any, stage: StageRuntime, prefix: Any, **kw: Any) -> Any:
            end = begin(state.epoch, kw)
            t0 = CLOCK()
            try:
                out = original(ctx, state, stage, prefix, **kw)
            finally:
                cpu = CLOCK() - t0
                extra = end()
            record(stage.layout.frozen, len(out[1]), out[3], cpu, extra)
            return out

        probe.patch(trainer, "run_epoch", lambda f: run_epoch)
        return

    class TimedEpochRun(trainer.EpochRun):  # type: ignore[name-defined,misc]
        def __init__(self, ctx: Any, stage: StageRuntime, prefix: Any, **kw: Any) -> None:
            self._end = begin(kw["epoch"], kw)
            self._frozen = stage.layout.frozen
            self._t0 = CLOCK()
            super().__init__(ctx, stage, prefix, **kw)

        def finish(self, step: int) -> Any:
            try:
                out = super().finish(step)
            finally:
                cpu = CLOCK() - self._t0
                extra = self._end()
            record(self._frozen, len(out[0]), out[2], cpu, extra)
            return out

    probe.patch(trainer, "EpochRun", lambda f: TimedEpochRun)


def tiny_vit(depth: int) -> torch.nn.Module:
    """A ViT with ``depth`` blocks whose compute is negligible: 8x8 one-channel images, 4x4 patches, width 16."""
    return models.vit("vit-tiny", depth=depth, dim=16, heads=2, mlp_dim=32, patch_size=4)


def one_run(
    args: argparse.Namespace, *, instrumented: bool, profiler: cProfile.Profile | None = None
) -> dict[str, Any]:
    """One training run; the per-step milliseconds of the measured (steady head-only) epochs (``profiler``: a
    plain run's measured epochs under cProfile)."""
    depth, batch, steps = args.depth, args.batch, args.steps
    n = int(batch * steps / 0.95) + 1
    gen = torch.Generator().manual_seed(0)
    samples = Split(torch.randn((n, 1, 8, 8), generator=gen), torch.randint(0, 10, (n,)), torch.arange(n))
    config = config_from_tables(
        {
            "model": {"name": "vit"},
            "data": {"eval_fraction": 0.05},
            "train": {
                "epochs": args.epochs,
                "global_batch": batch,
                "optimizer": "adamw",
                "lr": 1e-4,
                "max_grad_norm": args.max_grad_norm,
            },
            "freeze": {"policy": "manual", "options": {"schedule": {1: depth}}},
            "pipeline": {"pipe_len": 1, "microbatches": 1, "cache": "on", "cache_mb": 256},
            "log": {"progress": args.progress, "eval_every": args.epochs},
        }
    )
    probe = Probe()
    if instrumented:
        instrument(probe)
    else:

        def begin(epoch: int, kw: dict[str, Any]) -> Callable[[], dict[str, float]]:
            profiling = profiler is not None and epoch >= 2  # the steady head-only epochs
            if profiling:
                profiler.enable()

            def end() -> dict[str, float]:
                if profiling:
                    profiler.disable()
                return {}

            return end

        probe.epochs = []  # type: ignore[attr-defined]
        watch_epochs(probe, begin)
    fused = args.optimizer == "fused"

    def adamw(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-4, fused=fused or None)

    try:
        with trainer.ElasticTrainer(config, model=tiny_vit(depth), data=samples, optimizer=adamw, quiet=True) as t:
            t.fit()
    finally:
        probe.restore()
    epochs: list[dict[str, Any]] = probe.epochs  # type: ignore[attr-defined]
    top = max(e["layout_frozen"] for e in epochs)
    measured = [e for e in epochs if e["layout_frozen"] == top][1:]  # the first carries the fill and warm-up
    if not measured:
        raise SystemExit("no steady head-only epoch: raise --epochs")
    total_steps = sum(e["steps"] for e in measured)
    # CPU time of the whole step loop of the epoch (its reductions at the end included), per step
    step_ms = 1e3 * sum(e["cpu_s"] for e in measured) / total_steps
    wall_ms = 1e3 * sum(e["seconds"] for e in measured) / total_steps
    out: dict[str, Any] = {"step_ms": step_ms, "wall_step_ms": wall_ms, "steps": total_steps}
    if instrumented:
        parts = {c: 1e3 * sum(e.get(c, 0.0) for e in measured) / total_steps for c in COMPONENTS if c != "loop_other"}
        parts["loop_other"] = step_ms - sum(parts.values())
        out["components_ms"] = parts
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """``args.repeats`` plain and instrumented runs, interleaved; the fastest of each (see the module docstring)."""
    plain_runs, runs = [], []
    for _ in range(args.repeats):  # interleaved: both see the same load on a shared machine
        plain_runs.append(one_run(args, instrumented=False))
        runs.append(one_run(args, instrumented=True))
    plain = [r["step_ms"] for r in plain_runs]
    best = min(runs, key=lambda r: float(r["step_ms"]))
    top: list[str] = []
    if args.profile:
        profiler = cProfile.Profile(CLOCK)
        steps = one_run(args, instrumented=False, profiler=profiler)["steps"]
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        top = [f"{steps} steps: " + line.strip() for line in text.getvalue().splitlines() if line.strip()]
    return {
        "cprofile_top_by_self_time": top,
        "label": args.label,
        "package": str(Path(elastic_pipe.__file__).resolve().parent),
        "plain_step_ms": min(plain),
        "plain_step_ms_runs": plain,
        "plain_wall_step_ms_runs": [r["wall_step_ms"] for r in plain_runs],
        "instrumented_step_ms": best["step_ms"],
        "instrumented_step_ms_runs": [r["step_ms"] for r in runs],
        "components_ms": best["components_ms"],
        "components_ms_min_over_runs": {c: min(r["components_ms"][c] for r in runs) for c in COMPONENTS},
        "measured_steps_per_run": runs[0]["steps"],
    }


def profiled_per_step(top: list[str]) -> dict[str, float] | None:
    """Python function calls and profiled CPU milliseconds per step, from the cProfile lines' header
    (``"120 steps: 53240 function calls (52036 primitive calls) in 0.385 seconds"``); a measure the machine's
    load moves far less than time does (``None`` without a profile)."""
    match = re.match(r"(\d+) steps: (\d+) function calls.* in ([0-9.]+) seconds", top[0]) if top else None
    if match is None:
        return None
    steps, calls, seconds = int(match[1]), int(match[2]), float(match[3])
    return {"python_calls_per_step": calls / steps, "profiled_ms_per_step": 1e3 * seconds / steps}


def compare(paths: list[str]) -> dict[str, Any]:
    """The arms of several result files side by side, the first as the baseline."""
    arms = [json.loads(Path(p).read_text())["arms"][0] for p in paths]
    for arm in arms:
        arm["profiled"] = profiled_per_step(arm.get("cprofile_top_by_self_time", []))
    base = arms[0]
    table = {c: {a["label"]: round(a["components_ms"][c], 4) for a in arms} for c in COMPONENTS}
    table["plain_step_ms"] = {a["label"]: round(a["plain_step_ms"], 4) for a in arms}
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "gpu_reference_ms": GPU_REFERENCE_MS,
        "arms": arms,
        "table_ms": table,
        "speedup_over_first": {a["label"]: base["plain_step_ms"] / a["plain_step_ms"] for a in arms},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS), help="the JSON written")
    ap.add_argument("--label", default="this checkout", help="the arm's name in the JSON")
    ap.add_argument("--depth", type=int, default=12, help="blocks (all frozen after epoch 0), as ViT-B/16's")
    ap.add_argument("--batch", type=int, default=512, help="global batch, as the GPU benchmark's")
    ap.add_argument("--steps", type=int, default=30, help="steps per epoch, as the GPU benchmark's")
    ap.add_argument("--epochs", type=int, default=6, help="epochs: 0 trains all, 1 fills, 2.. are measured")
    ap.add_argument("--repeats", type=int, default=5, help="runs per arm (the fastest reported)")
    ap.add_argument("--max-grad-norm", type=float, default=0.0, help="clip (0: off, as the GPU benchmark)")
    ap.add_argument(
        "--optimizer",
        choices=("fused", "single"),
        default="fused",
        help="AdamW fused (as on the GPU; torch's CPU kernel) or torch's CPU default (one tensor at a time)",
    )
    ap.add_argument("--progress", action="store_true", help="progress lines on (off in the GPU benchmark)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared host)")
    ap.add_argument("--profile", type=int, default=0, help="also a run under cProfile: its top N functions")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="merge result files (the first is the baseline)")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.compare:
        report = compare(args.compare)
    else:
        torch.set_num_threads(args.threads)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"})
        dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            arm = measure(args)
        finally:
            dist.destroy_process_group()
        report = {
            "what": "host ms per head-only step of the trainer loop, per component (CPU, negligible compute)",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": args.threads},
            "settings": {
                k: getattr(args, k)
                for k in ("depth", "batch", "steps", "epochs", "repeats", "max_grad_norm", "optimizer")
            },
            "gpu_reference_ms": GPU_REFERENCE_MS,
            "arms": [arm],
        }
    out.write_text(json.dumps(report, indent=1))
    for arm in report["arms"]:
        print(f"--- {arm['label']}: {arm['plain_step_ms']:.3f} ms/step plain, {arm['instrumented_step_ms']:.3f} timed")
        for c, ms in arm["components_ms"].items():
            print(f"{c:>18}: {ms:7.4f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
