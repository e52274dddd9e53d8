"""Building one rank's pipeline stages: their schedule runner (declared shapes, one ``PipelineStage`` per stage the
rank holds, or a :class:`~.local_step.LocalStep` for one stage and one micro-batch, graphed or not) and the freeze
units their sub-layers hold."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TypedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from elastic_pipe import schedule as sched
from elastic_pipe.orchestrator.stage.graphed_step import GraphedStep, StageRunner
from elastic_pipe.orchestrator.stage.local_step import LocalStep

__all__: list[str] = []  # internal: the package face exports what others use


class _Shapes(TypedDict, total=False):
    """What a torch 2.12+ ``PipelineStage`` is told of its micro-batches up front (gradients: ``None`` at the ends)."""

    input_args: torch.Tensor
    output_args: torch.Tensor
    input_grads: torch.Tensor | None
    output_grads: torch.Tensor | None


def _stage_takes_grads() -> bool:
    return "input_grads" in inspect.signature(PipelineStage.__init__).parameters


#: Whether this torch's PipelineStage accepts declared gradient shapes (``input_grads``/``output_grads``).
_STAGE_TAKES_GRADS = _stage_takes_grads()

#: Examples of one micro-batch at a stage's input and output (what its ``PipelineStage`` declares).
Examples = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def build_runner(
    module: nn.Module,
    *,
    stage: int,
    schedule: sched.Schedule,
    device: torch.device,
    group: dist.ProcessGroup,
    examples: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    compiled: bool = False,
    grad_input: bool = False,
    graph: bool = False,
    graph_always: bool = False,
    others: Sequence[tuple[int, nn.Module, Examples]] = (),
) -> StageRunner:
    """Wrap ``module`` as stage ``stage`` of ``schedule`` and return the schedule runner that steps it.

    Args:
        module: the stage's sub-layers.
        stage: this rank's stage index.
        schedule: the layout's schedule (:func:`elastic_pipe.schedule.generate`, generated once per layout): its
            ranks are the pipeline's, its stages ``1 + len(others)`` per rank, its micro-batches those of a step.
        device: this rank's device.
        group: the pipeline group of this rank's replica.
        examples: returns example micro-batches at the stage's input and output (``StageRuntime._example_io``);
            called only when a :class:`~torch.distributed.pipelining.PipelineStage` is built, to declare its shapes
            and, by their ``requires_grad``, whether a gradient crosses each of its boundaries.
        loss_fn: ``loss_fn(output, target)``, run by the last stage.
        compiled: ``module`` is built from compiled sub-layers (see :class:`LocalStep`).
        grad_input: the one-stage step's input always carries a gradient (see :class:`LocalStep`).
        graph: replay the one-stage step as a CUDA graph
            (:func:`~elastic_pipe.orchestrator.stage.graph_choice.decide_graph` says when that is safe).
        graph_always: capture without first checking that the step is host-bound (``cuda_graphs = "on"``).
        others: the further stages this rank holds (virtual stages: index, sub-layers, examples), so that the
            pipeline has ``ranks * (1 + len(others))`` stages placed in loop style (stage ``s`` on rank
            ``s % ranks``); ``stage`` is then this rank's first.

    Returns:
        An object whose ``step`` runs one training step: a torch schedule, or for one stage and one micro-batch
        a :class:`LocalStep` (wrapped in a :class:`~elastic_pipe.orchestrator.stage.graphed_step.GraphedStep` with
        ``graph``).
    """
    held = [(stage, module, examples), *others]
    if _local(schedule):
        local = LocalStep(module, loss_fn, compiled=compiled, grad_input=grad_input)
        return GraphedStep(local, always=graph_always) if graph else local
    n = schedule.num_stages
    stages = [_pipeline_stage(m, s, n, device=device, group=group, examples=ex) for s, m, ex in held]
    runner: StageRunner = sched.torch_schedule(  # torch's schedule
        schedule, stage % schedule.num_ranks, stages, loss_fn, scale_grads=True
    )
    return runner


def _local(schedule: sched.Schedule) -> bool:
    """Whether a rank steps ``schedule`` as a :class:`LocalStep`: one stage, one micro-batch, one backward."""
    return schedule.num_stages == 1 and schedule.microbatches == 1


def splits_backward(schedule: sched.Schedule) -> bool:
    """Whether the schedule runs a stage's input and weight gradients apart (``W`` actions: ``zb1p``)."""
    if _local(schedule):
        return False  # a LocalStep: one backward
    return any(a.kind is sched.ActionKind.W for acts in schedule.actions.values() for a in acts)


def _pipeline_stage(
    module: nn.Module, s: int, num_stages: int, *, device: torch.device, group: dist.ProcessGroup, examples: Examples
) -> PipelineStage:
    """Stage ``s`` of ``num_stages`` over ``module``, its shapes declared from ``examples``."""
    example_in, example_out = examples()
    # A gradient crosses a boundary where its example requires one (after the model's first trainable sub-layer):
    # a stage behind parameter-free or frozen sub-layers neither computes nor sends an input gradient, and one that
    # trains nothing behind them receives none.
    grad_in, grad_out = example_in.requires_grad and s > 0, example_out.requires_grad and s < num_stages - 1
    example_out = example_out.detach()
    # Shapes are declared up front where torch accepts gradient shapes too (2.12+).
    shapes: _Shapes = {}
    if _STAGE_TAKES_GRADS:
        shapes = {
            "input_args": example_in,
            "output_args": example_out,
            "input_grads": example_in if grad_in else None,
            "output_grads": example_out if grad_out else None,
        }
    pipe_stage = PipelineStage(module, s, num_stages, device, group=group, **shapes)
    if not _STAGE_TAKES_GRADS:
        _declare_shapes_before_2_12(pipe_stage, example_in, example_out)
    return pipe_stage


def _declare_shapes_before_2_12(pipe_stage: PipelineStage, example_in: torch.Tensor, example_out: torch.Tensor) -> None:
    """Set what torch < 2.12 would infer at the first step, from the examples we already have.

    Declaring only the activations through the constructor there leaves the backward without its output gradient,
    and the inference torch runs instead is a real forward of zeros inside the first step (its dropout draws move
    the step's random stream, so a run resumed mid-epoch would draw other masks than the uninterrupted one) whose
    shapes travel pickled (``send_object_list``). Its result is two attributes, set here directly.
    """
    configure = getattr(pipe_stage, "_configure_outputs_meta", None)
    if configure is None:  # not the internals of torch 2.11: leave the inference to torch
        return
    setattr(pipe_stage, "inputs_meta", (example_in.to("meta"),))  # noqa: B010 - absent from newer torch's stubs
    configure((example_out.to("meta"),))


def unit_of(unit_ends: Sequence[int], j: int) -> int | None:
    """The freeze unit sub-layer ``j`` belongs to (``None`` after the last unit ends)."""
    for unit, end in enumerate(unit_ends):
        if j < end:
            return unit
    return None


def unit_modules(
    sublayers: Sequence[nn.Module], unit_ends: Sequence[int], lo: int, hi: int
) -> dict[int, nn.ModuleList]:
    """The parts of each freeze unit that sub-layers ``lo:hi`` hold, keyed by unit (for the gradient tracker)."""
    held: dict[int, nn.ModuleList] = {}
    for j in range(lo, hi):
        unit = unit_of(unit_ends, j)
        if unit is not None:
            held.setdefault(unit, nn.ModuleList()).append(sublayers[j])
    return held
