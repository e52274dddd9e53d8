"""Inductor's pool of compile workers, started before a job's first timed arm and kept up for every arm alike.

``torch.compile`` compiles its Triton kernels in a pool of worker processes that Inductor starts at a process's
first compilation (a helper process importing torch, then one worker per compile thread) and shuts down again
after 60 s without a compilation (``torch._inductor.config.quiesce_async_compile_pool``). Where several arms share
one process, the first arm that compiles pays for starting the pool, beside its own steps and its loader's
workers. Measured on one H100 (``time_to_accuracy.py --task digits``, the compiled loop, Inductor's kernels on
disk from an earlier job, no recompilation in dynamo's log): its epochs 2 and 3 took 1.5-3.5 s where the later
ones took 0.58 s. :func:`warm_compile_pool` starts the pool, waits until its workers have started and gone idle,
and keeps it up for the job; the report gives the seconds it took beside the arms, which none of them pays.

Keeping it up sets ``quiesce_async_compile_pool``, which is part of Inductor's cache key: a job that starts the pool
first finds on disk only what jobs that did the same compiled (every seed's job of a time-to-accuracy re-measure
does), and compiles cold after jobs that did not (``compile_pool_ab.sh`` warms each way on its own).

The pool is not all that a process's first compilation pays once: the parent's own set-up (Inductor's modules
imported, Triton's launcher built and loaded, the first reduction's configurations tuned) goes to whichever arm
compiles first, the compiled loop in both benchmarks. Measured on one H100 (``bench_single_gpu.py --arms
elastic_compiled_graphs`` alone in a fresh process, ``benchmarks/results/compile_alone_{lazy,first}.json``): its
compilation took 11.35 s with the pool started by the arm and 7.74 s with it started first, against 5.70 s in the
headline's job, where the compiled loop had compiled before it. :func:`warm_compile_pool` therefore also runs
:func:`first_compilation` once the pool is idle: a small module compiled, run forward and backward, then dynamo
reset, so that every arm finds the process set up alike (its seconds are the report's ``first_compile_s``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["first_compilation", "warm_compile_pool"]


def _stat(proc: Path, pid: str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the state first), or None once it is gone."""
    try:
        return (proc / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # the process ended while the table was read


def _children(proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """Every process's children, by parent pid, from ``proc`` (Linux's ``/proc``; empty where there is none)."""
    tree: dict[int, list[int]] = {}
    for entry in proc.glob("[0-9]*"):
        fields = _stat(proc, entry.name)
        if fields is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def descendants_cpu_seconds(pid: int | None = None, *, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) that the processes below ``pid`` (default: this one) have used so far."""
    tree, tick = _children(proc), os.sysconf("SC_CLK_TCK")
    todo, total = list(tree.get(pid or os.getpid(), [])), 0
    while todo:
        child = todo.pop()
        todo.extend(tree.get(child, []))
        fields = _stat(proc, str(child))
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / tick


def warm_compile_pool(*, start: bool = True, settle_s: float = 0.5, limit_s: float = 120.0) -> dict[str, Any]:
    """Start Inductor's compile pool on a CUDA machine and wait until it is idle; keep it up for the process; then
    pay the process's first compilation (:func:`first_compilation`).

    Waits until the processes below this one used less than a tenth of one core over ``settle_s`` (the workers
    have imported what they need), at most ``limit_s``. Returns what to record in the report: how the pool was
    handled, the seconds it took, the pool's size and the first compilation's seconds (``first_compile_s``);
    nothing is done with ``start=False``, without CUDA or where this torch has no such pool (``"compile_pool":
    "not started"``).
    """
    if not start:
        return {"compile_pool": "not started"}
    try:
        from torch._inductor import config
        from torch._inductor.async_compile import AsyncCompile
    except ImportError:
        return {"compile_pool": "not started"}
    if not torch.cuda.is_available() or not hasattr(AsyncCompile, "wait_pool_ready"):
        return {"compile_pool": "not started"}
    t0 = time.perf_counter()
    config.quiesce_async_compile_pool = False  # no arm restarts it after another's idle minute
    AsyncCompile.warm_pool()
    AsyncCompile.wait_pool_ready(timeout=limit_s)
    before = descendants_cpu_seconds()
    while time.perf_counter() - t0 < limit_s:
        time.sleep(settle_s)
        now = descendants_cpu_seconds()
        if now - before < 0.1 * settle_s:
            break
        before = now
    pool_s = time.perf_counter() - t0
    return {
        "compile_pool": "started before the first arm and kept up (benchmarks/gpu/_compile_pool.py)",
        "compile_pool_s": round(pool_s, 3),
        "compile_threads": config.compile_threads,
        "first_compile_s": round(first_compilation(torch.device("cuda")), 3),
    }


class _Small(torch.nn.Module):
    """What :func:`first_compilation` compiles: a matrix product, a reduction (layer norm) and a pointwise op, the
    kinds of kernel a transformer block's forward and backward need."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.outer = torch.nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.nn.functional.gelu(self.norm(self.inner(x))))


def first_compilation(device: torch.device) -> float:
    """Compile a small module, run it forward and backward (under bf16 autocast on CUDA, as the arms do) on
    ``device``, then reset dynamo so that no arm reuses its code; the seconds it took."""
    t0 = time.perf_counter()
    module = _Small().to(device)
    compiled = torch.compile(module, dynamic=False)
    x = torch.randn(32, 64, device=device)
    with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        out = compiled(x)
    out.float().square().mean().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    torch._dynamo.reset()
    return time.perf_counter() - t0
