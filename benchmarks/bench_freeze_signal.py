"""What the freeze policies' signals cost, as a fraction of the training step (issue #19: < 2%).

Run: ``python benchmarks/bench_freeze_signal.py --out signal.json`` (CUDA: ViT-B/16 at 224 px, bf16 autocast,
batch 512; CPU: a small ViT). One process, one device; under a minute on an H200.

Measured, each the median over alternated steps after a warm-up (alternating spreads a busy neighbour or a
drifting clock over every variant alike); every step ends with a device synchronisation, so a step's time is what
it costs the run:

* ``plain``: forward, backward, AdamW step, ``zero_grad``: what a schedule-driven policy (``freezeout``, ``alpha``)
  or the probe-driven ``drift`` runs per step - they gather no per-step signal at all;
* ``tracked``: the same plus ``GradNormTracker.accumulate()`` over the units a gradient-driven policy reads
  (``settled``'s ``signal_layers``: floor(0.85 L)), one fused ``_foreach_add_`` per step, no read-back;
* ``tracked_all``: the same over all L units (``autofreeze``, ``paper``);
* ``per_layer``: the accumulation as the tracker did it before (one ``_foreach_add_`` per unit, the parameters
  listed anew each step), for comparison;
* each accumulation alone on one step's gradients (``accumulate_alone_ms``; steadier than a difference of steps);
* per decision point: ``local_stats`` (the norms, one read-back) and the probe of ``drift`` (16 samples through the
  watched units in eval mode, ``OutputDrift.measure``), eagerly and replayed as one CUDA graph per unit
  (``ForwardGraphs``, as the trainer runs it on CUDA; ``probe_capture_ms`` is the call that captured them, paid
  once per layout).

The fractions: per-step overhead / plain step, plus the per-decision costs spread over ``--interval`` steps.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elastic_pipe import freeze, models
from elastic_pipe.orchestrator.stage.forward_graphs import ForwardGraphs

#: The GPU configuration: ViT-B/16 at 224 px (12 blocks, width 768, 197 tokens), batch 512.
GPU = {"config": "vit-b16", "batch": 512, "overrides": {}}
#: The CPU stand-in: vit-tiny (6 blocks, width 64, 17 tokens), batch 64.
CPU = {"config": "vit-tiny", "batch": 64, "overrides": {}}
PROBE_SAMPLES = 16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


class _PerLayer:
    """The accumulation as the tracker did it before: per unit, its parameters listed anew and one fused add."""

    def __init__(self, layers: dict[int, nn.Module]) -> None:
        self.layers = layers
        self.sums: dict[int, list[torch.Tensor | None]] = {}

    @torch.no_grad()
    def accumulate(self) -> None:
        for index, module in self.layers.items():
            params = list(module.parameters())
            sums = self.sums.setdefault(index, [None] * len(params))
            runs, grads = [], []
            for j, p in enumerate(params):
                if p.grad is None:
                    continue
                if sums[j] is None:
                    sums[j] = p.grad.detach().to(torch.float32, copy=True)
                else:
                    runs.append(sums[j])
                    grads.append(p.grad.detach())
            if runs:
                torch._foreach_add_(runs, grads)  # type: ignore[arg-type]


def measure(config: dict[str, Any], device: torch.device, steps: int, warmup: int, interval: int) -> dict[str, Any]:
    """Every variant's step time and the per-decision costs; see the module docstring."""
    torch.manual_seed(0)
    vit_cfg = models.vit_config(config["config"], **config["overrides"])
    model = models.vit(vit_cfg).to(device).train()
    units = model.num_units
    autocast = device.type == "cuda"
    example = torch.randn(config["batch"], vit_cfg.in_channels, vit_cfg.image_size, vit_cfg.image_size, device=device)
    y = torch.randint(0, 10, (config["batch"],), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    loss_fn = nn.CrossEntropyLoss()
    unit_modules = {u: nn.ModuleList(model.unit_modules(u)) for u in range(units)}
    watched = freeze.signal_layers(freeze.make_policy("settled", units))
    tracked = freeze.GradNormTracker({u: m for u, m in unit_modules.items() if u < watched})
    tracked_all = freeze.GradNormTracker(unit_modules)
    per_layer = _PerLayer({u: m for u, m in unit_modules.items() if u < watched})
    hooks: dict[str, Callable[[], None] | None] = {
        "plain": None,
        "tracked": tracked.accumulate,
        "tracked_all": tracked_all.accumulate,
        "per_layer": per_layer.accumulate,
    }

    def step(hook: Callable[[], None] | None) -> None:
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            out = model(example)
        loss = loss_fn(out.float(), y)
        loss.backward()
        if hook is not None:
            hook()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        for hook in hooks.values():
            step(hook)
    times: dict[str, list[float]] = {name: [] for name in hooks}
    for _ in range(steps):
        for name, hook in hooks.items():
            times[name].append(_timed(lambda h=hook: step(h), device))
    median = {name: statistics.median(v) for name, v in times.items()}
    # the accumulations alone, on one step's gradients: less noisy than a difference of two step times
    with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
        out = model(example)
    loss_fn(out.float(), y).backward()
    alone = {
        name: statistics.median(_timed(hook, device) for _ in range(10))
        for name, hook in hooks.items()
        if hook is not None
    }
    optimizer.zero_grad(set_to_none=True)
    local_stats_s = statistics.median(_timed(lambda: tracked.local_stats(units), device) for _ in range(5))

    probe = example[:PROBE_SAMPLES]
    probed = freeze.signal_layers(freeze.make_policy("drift", units, total_steps=steps))  # the default: all units
    dtype = torch.bfloat16 if autocast else None
    eager_graphs = ForwardGraphs(device, autocast_dtype=dtype, enabled=False)
    replayed = ForwardGraphs(device, autocast_dtype=dtype)

    def prober(graphs: ForwardGraphs) -> Callable[[], None]:
        drift = freeze.OutputDrift()

        @torch.no_grad()
        def probe_once() -> None:
            outputs: dict[int, torch.Tensor] = {}
            h = probe
            for u in range(probed):
                h = graphs.run(u, h, lambda u=u: model.slice(*model.unit_bounds(u)))
                outputs[u] = h
            freeze.relative_change(*drift.measure(outputs, units))

        return probe_once

    probe_eager, probe_replayed = prober(eager_graphs), prober(replayed)
    probe_eager()
    probe_replayed()  # the warm-up (eager); the next call captures
    capture_s = _timed(probe_replayed, device)
    probe_s = statistics.median(_timed(probe_eager, device) for _ in range(5))
    replay_s = statistics.median(_timed(probe_replayed, device) for _ in range(5))
    if replayed.enabled and (replayed.captures != probed or replayed.failures):
        raise RuntimeError(f"the probe did not capture all {probed} units: {replayed.failures}")
    plain = median["plain"]

    def fraction(per_step: float, per_decision: float) -> float:
        return (per_step + per_decision / interval) / plain

    return {
        "model": config["config"],
        "overrides": config["overrides"],
        "batch": config["batch"],
        "units": units,
        "watched_units": watched,
        "probed_units": probed,
        "params": sum(p.numel() for p in model.parameters()),
        "autocast": "bf16" if autocast else "none",
        "steps_timed": steps,
        "interval_steps": interval,
        "step_ms": {name: 1e3 * v for name, v in median.items()},
        "accumulate_alone_ms": {name: 1e3 * v for name, v in alone.items()},
        "local_stats_ms": 1e3 * local_stats_s,
        "probe_ms": 1e3 * probe_s,
        "probe_replayed_ms": 1e3 * replay_s,
        "probe_capture_ms": 1e3 * capture_s,
        "signal_fraction": {
            "settled (tracked, floor(0.85 L) units)": fraction(median["tracked"] - plain, local_stats_s),
            "autofreeze (tracked, all units)": fraction(median["tracked_all"] - plain, local_stats_s),
            "before: one add per unit": fraction(median["per_layer"] - plain, local_stats_s),
            "drift (probe per decision point, replayed)": fraction(0.0, replay_s),
            "drift (probe per decision point, eager)": fraction(0.0, probe_s),
            "freezeout / alpha": 0.0,
        },
        "signal_fraction_alone": {
            "settled (tracked, floor(0.85 L) units)": fraction(alone["tracked"], local_stats_s),
            "autofreeze (tracked, all units)": fraction(alone["tracked_all"], local_stats_s),
            "before: one add per unit": fraction(alone["per_layer"], local_stats_s),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=None, help="write the measurements here (JSON)")
    ap.add_argument("--config", default=None, help="a ViT preset (default: vit-b16 on CUDA, vit-tiny on CPU)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], help="preset override key=int, e.g. depth=6")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per variant")
    ap.add_argument("--interval", type=int, default=50, help="steps between decision points")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = dict(GPU if device.type == "cuda" else CPU)
    if args.config:
        config["config"] = args.config
    if args.batch:
        config["batch"] = args.batch
    config["overrides"] = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    t0 = time.perf_counter()
    result = measure(config, device, args.steps, args.warmup, args.interval)
    result.update(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__,
        seconds=time.perf_counter() - t0,
        command="python benchmarks/bench_freeze_signal.py " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
