"""One rank's stage in one layout: the stage module and its runner, gradient tracking and sync.

With several stages per rank (``layout.virtual`` > 1, loop placement) the rank's "stage" is its pipeline position:
it holds one module per stage it runs (:meth:`~elastic_pipe.types.Layout.placement`), and one runner steps them all.

A :class:`StageRuntime` is built from a layout and thrown away at the next transition; nothing in it outlives its
layout. The frozen prefix before stage 0 is the run's :class:`~.prefix.FrozenPrefix`, which outlives layouts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import freeze
from elastic_pipe import schedule as sched
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.stage.build import build_runner, splits_backward, unit_modules
from elastic_pipe.orchestrator.stage.forward_graphs import ForwardGraphs
from elastic_pipe.orchestrator.stage.forward_timer import ForwardTimer
from elastic_pipe.orchestrator.stage.grad_sync import OverlappedAverager, average_gradients
from elastic_pipe.orchestrator.stage.graph_choice import GraphChoice, decide_graph

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.stage.graphed_step import StageRunner
    from elastic_pipe.types import Layout

__all__ = ["StageRuntime"]


def _widen(t: torch.Tensor, rows: int, requires_grad: bool) -> torch.Tensor:
    """``t``'s first row repeated ``rows`` times (contiguous: torch allocates its receive buffers like it)."""
    return t.detach()[:1].expand(rows, *t.shape[1:]).contiguous().requires_grad_(requires_grad)


class _NoGradStage(nn.Sequential):
    """A stage that neither trains a parameter nor receives an input that needs a gradient (parameter-free or
    frozen sub-layers behind nothing trainable): its forward runs without autograd, so it saves nothing for a
    backward pass, and its output carries no gradient history (torch's schedules then skip its backward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The sub-layers in order, under ``torch.no_grad``."""
        with torch.no_grad():
            for layer in self:
                x = layer(x)
        return x


def _first_trainable(sublayers: Sequence[nn.Module]) -> int:
    """The first of ``sublayers`` with a trainable parameter (``len(sublayers)`` if none)."""
    return next((j for j, m in enumerate(sublayers) if any(p.requires_grad for p in m.parameters())), len(sublayers))


def gradient_from(first: int, boundaries: Sequence[int], *, split_backward: bool) -> int:
    """The first stage boundary (a sub-layer index) that a gradient crosses backwards: no gradient flows into
    the sub-layers before the first trainable one, ``first``, so one crosses every boundary after it.

    A schedule that splits the backward (``W`` actions: ``zb1p``) needs one at the input of the stage holding
    ``first`` too: torch's input-gradient pass finds a stage's weight gradients through its input's gradient, and
    takes none from a stage after the first whose input needs none.
    """
    if split_backward and first < boundaries[-1]:
        return max((b for b in boundaries[:-1] if b <= first), default=boundaries[0])
    return first + 1


class _Closed:
    """The runner of a closed stage (:meth:`StageRuntime.close` lets its runners go): it runs no step."""

    def step(self, *args: object, **kwargs: object) -> None:
        raise OrchestratorError("this stage was closed (a transition replaced it): it runs no step")


_CLOSED = _Closed()


class StageRuntime:
    """This rank's stage of ``layout`` (its stages, with several per rank): what a step runs.

    Args:
        ctx: the rank's fixed facts.
        layout: the layout the stage belongs to.
    """

    def __init__(self, ctx: RunContext, layout: Layout) -> None:
        self.ctx = ctx
        self.layout = layout
        plan = ctx.plan(layout)
        #: The rank's pipeline position; with one stage per rank also its stage index.
        self.stage = int(plan.stage_of(ctx.rank))
        self.replica = int(plan.replica_of(ctx.rank))
        self.owned = ctx.owned(layout)
        #: Which stages, and so which sub-layers, each rank of the pipeline runs (loop style).
        self.placement = layout.placement()
        #: The stages this rank runs and their sub-layers ``(lo, hi)``, in order (one with one stage per rank).
        self._stages = self.placement.stages_of(self.stage)
        self._ranges = self.placement.ranges_of(self.stage)
        sublayers = ctx.sublayers
        # Frozen-aware stages (docs/schedule.md), decided here once per layout: no gradient flows into the
        # sub-layers before the first trainable one, so a stage that ends at or before it runs without autograd,
        # and a gradient crosses only the boundaries from grad_from on (what each stage declares).
        first = _first_trainable(sublayers)
        #: The layout's schedule, generated once: what every step size's runner steps.
        self.schedule = sched.generate(ctx.parts.schedule, layout.pipe_len, layout.microbatches, layout.virtual)
        #: The first stage boundary a gradient crosses (:func:`gradient_from`).
        self.grad_from = gradient_from(first, layout.boundaries, split_backward=splits_backward(self.schedule))
        self.modules = [
            (_NoGradStage if hi <= first else nn.Sequential)(*ctx.stage_sublayers(lo, hi)) for lo, hi in self._ranges
        ]
        for m in self.modules:
            m.train()
        #: The module of the rank's first stage (its only one with one stage per rank).
        self.module = self.modules[0]
        #: The micro-batch size of a full step; a short last step has a runner of its own (declared shapes).
        self.rows = ctx.config.train.global_batch // layout.replicas // layout.microbatches
        self._runners: dict[int, StageRunner] = {}
        #: Whether each step size's runner replays a CUDA graph, and why not (``[train] cuda_graphs``).
        self.graph_choices: dict[int, GraphChoice] = {}
        self.runner: StageRunner = self.runner_for(self.rows)
        self.forward_timer = ForwardTimer(self.modules, ctx.device)
        # only the units the policy can still freeze: frozen ones are outside the stage, those past the policy's
        # cap (freeze.signal_layers) are never read
        watched = freeze.signal_layers(ctx.parts.policy)
        tracked: dict[int, nn.ModuleList] = {}
        for lo, hi in self._ranges if ctx.track_gradients else ():
            for u, held in unit_modules(sublayers, ctx.unit_ends, lo, hi).items():
                tracked.setdefault(u, nn.ModuleList()).extend(held)
        self.tracker = freeze.GradNormTracker({u: m for u, m in tracked.items() if u < watched})
        #: The probe outputs of the units this rank holds, for a probe-driven policy (:mod:`.probe`); else None.
        self.drift = freeze.OutputDrift() if freeze.needs_probe(ctx.parts.policy) else None
        #: The probe's forwards, replayed as CUDA graphs once captured (:mod:`.forward_graphs`); with the drift.
        self.probe_graphs = (
            ForwardGraphs(ctx.device, autocast_dtype=ctx.autocast_dtype, enabled=ctx.config.train.cuda_graphs != "off")
            if self.drift is not None
            else None
        )
        #: The probe batch's inputs on the device, read at the layout's first probe on the stage that reads inputs.
        self.probe_inputs: torch.Tensor | None = None
        params = [p for j in self.owned for p in sublayers[j].parameters() if p.requires_grad]
        #: Whether the rank's gradients are averaged over its replicas: not when its stages train no parameter
        #: (parameter-free or frozen sub-layers only), which then run no all-reduce at all.
        self.syncs = layout.replicas > 1 and bool(params)
        self.averager: OverlappedAverager | None = None
        if self.syncs and layout.microbatches == 1:
            # With one micro-batch and several replicas, gradients are averaged while the backward pass runs.
            self.averager = OverlappedAverager(params, group=self._dp_group(), replicas=layout.replicas)

    @property
    def is_first(self) -> bool:
        """Whether this rank runs stage 0 (and so the frozen prefix)."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank runs the last stage (and so the loss; loop placement puts it on the last position)."""
        return self.stage == self.layout.pipe_len - 1

    def _dp_group(self) -> dist.ProcessGroup:
        group: dist.ProcessGroup = self.ctx.groups.dp_group(self.layout.pipe_len)
        return group

    def runner_for(self, rows: int) -> StageRunner:
        """The schedule runner of micro-batches of ``rows`` samples (built at first use; a collective then, in the
        replica's pipeline, when torch infers the shapes)."""
        runner = self._runners.get(rows)
        if runner is None:
            ctx, layout = self.ctx, self.layout
            (lo, hi), stage = self._ranges[0], self._stages[0]
            choice = self.graph_choices[rows] = decide_graph(
                ctx.config.train.cuda_graphs,
                device_type=ctx.device.type,
                pipe_len=layout.num_stages,  # with one stage per rank, its length
                microbatches=layout.microbatches,
                replicas=layout.replicas,
                rows=rows,
                full_rows=self.rows,
            )
            runner = self._runners[rows] = build_runner(
                self.module,
                stage=stage,
                schedule=self.schedule,
                device=ctx.device,
                group=ctx.groups.pipeline_group(layout.pipe_len),
                examples=lambda: self._example_io(lo, hi, rows),
                loss_fn=ctx.parts.loss,
                compiled=ctx.compiled is not None,
                # a stage at the model's input never receives a gradient-carrying one, in any layout
                grad_input=ctx.compiled is not None and lo > 0,
                graph=choice.use,
                graph_always=ctx.config.train.cuda_graphs == "on",
                others=[
                    (s, m, functools.partial(self._example_io, lo_s, hi_s, rows))
                    for s, m, (lo_s, hi_s) in zip(self._stages[1:], self.modules[1:], self._ranges[1:], strict=True)
                ],
            )
        return runner

    def _example_io(self, lo: int, hi: int, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Example micro-batch tensors of ``mb`` rows at the stage's input and output.

        They come from the boundary examples taken at setup (:attr:`RunContext.examples`): a stage declares
        shapes and dtypes, which need none of the sub-layers before it, so a rank that holds only its stage can
        declare them. Each example requires a gradient where one crosses that boundary (:attr:`grad_from`). A
        stage behind a trainable one receives an activation that needs a gradient, and the metadata must say so,
        or the stage computes no input gradient and the stages before it train on zeros; one behind only
        parameter-free or frozen sub-layers declares none, so that it computes and sends no gradient nobody reads.
        """
        x, y = self.ctx.examples[lo], self.ctx.examples[hi]
        grads_in, grads_out = lo >= self.grad_from, hi >= self.grad_from
        return _widen(x, mb, grads_in and x.is_floating_point()), _widen(y, mb, grads_out and y.is_floating_point())

    # ------------------------------------------------------------------------------------------------- a step
    def run(
        self, x: torch.Tensor | None, y: torch.Tensor | None, losses: list[torch.Tensor], *, rows: int | None = None
    ) -> None:
        """One pipelined forward and backward of this stage (a collective in the replica's pipeline).

        Args:
            rows: samples per micro-batch (a short last step has fewer); ``None``: a full step's.
        """
        runner = self.runner if rows is None or rows == self.rows else self.runner_for(rows)
        with self.ctx.autocast():
            if self.layout.pipe_len == 1:
                runner.step(x, target=y, losses=losses)
            elif self.is_first:
                runner.step(x)
            elif self.is_last:
                runner.step(target=y, losses=losses)
            else:
                runner.step()

    def grad_sync(self) -> int:
        """Average the stage's gradients over its replica group; returns the number of all-reduce calls (none with
        one replica, or when the rank's stages train no parameter)."""
        if not self.syncs:
            return 0
        if self.averager is not None:
            return self.averager.finish()
        sublayers = self.ctx.sublayers
        grads = [p.grad for j in self.owned for p in sublayers[j].parameters() if p.grad is not None]
        return average_gradients(grads, group=self._dp_group(), replicas=self.layout.replicas)

    def close(self) -> None:
        """Take this stage's hooks off the model's parameters and modules. Idempotent."""
        if self.averager is not None:
            self.averager.remove()
            self.averager = None
        self.forward_timer.remove()
        self.runner = _CLOSED
        self._runners.clear()
        self.drift = None
        self.probe_graphs = None
        self.probe_inputs = None
