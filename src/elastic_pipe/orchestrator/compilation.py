"""Regional compilation of a model's sub-layers (``[train] compile``) and the compilation time torch measured.

A stage is built from the compiled wrappers (:func:`compile_sublayers`); :func:`compile_seconds` reads torch's own
compile-time metrics, so a stage can report the compilation its first steps paid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["compile_enabled", "compile_seconds", "compile_sublayers"]


def compile_enabled(config: TrainConfig, device: torch.device) -> bool:
    """Whether ``[train] compile`` turns compilation on here ("auto": on CUDA devices only)."""
    mode = config.train.compile
    return mode == "on" or (mode == "auto" and device.type == "cuda")


#: The compile-time metrics torch keeps per call (``torch._dynamo.utils.compilation_time_metrics``) that together
#: cover one compilation: dynamo's frame compile (tracing plus the forward graph's inductor compile) and the
#: backward graph's compile, which AOTAutograd runs lazily at the first backward.
_COMPILE_METRICS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")


def compile_seconds() -> float:
    """Seconds this process has spent compiling with ``torch.compile`` so far (0 where torch keeps no such metric).

    The difference between two calls is the compilation in between, as torch measured it.
    """
    metrics = getattr(getattr(torch, "_dynamo", None), "utils", None)
    table = getattr(metrics, "compilation_time_metrics", None)
    if not isinstance(table, dict):
        return 0.0
    return float(sum(sum(table.get(name, ())) for name in _COMPILE_METRICS))


def compile_sublayers(model: nn.Module) -> list[nn.Module]:
    """Regional compilation: a compiled wrapper of each sub-layer (``torch.compile``), sharing its parameters.

    Stages are built from the wrappers, so one compiled region per sub-layer class serves every block of that
    class and every layout: a transition only regroups compiled sub-layers, and compiles again only where a
    stage's first sub-layer stops receiving a gradient-carrying input. The model itself stays eager: the frozen
    prefix (run once per transition to fill the cache, or per step without it) and the evaluation run it, which
    measured faster on short runs than compiling their ``no_grad`` variants (docs/benchmarks.md).

    Shapes are static (``dynamic=False``): each micro-batch size gets its own compiled code, chosen by that size
    alone. With torch's default (a second size recompiles the region with a symbolic batch, which then serves every
    size) the code a step runs would depend on the sizes the process saw before it, so a run resumed inside an
    epoch could run other kernels (other reduction orders) than the uninterrupted run at the same step.
    """
    return [cast(nn.Module, torch.compile(sub, dynamic=False)) for sub in model.children()]
