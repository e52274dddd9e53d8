"""CUDA-graph training steps: a layout's forward, loss and backward captured once and replayed every step.

A step whose layers are nearly all frozen (the head-only layout, or a short stage behind the activation cache)
does about a millisecond of GPU work and several of Python and kernel launches: the host sets the pace. A CUDA
graph replays the whole forward + loss + backward with one launch. The recipe is torch's documented whole-network
capture (``torch.cuda.graph``, written once in :mod:`~elastic_pipe.orchestrator.stage.capture`): warm up eagerly
on a side stream, capture once with static input buffers, then per step copy the new batch into those buffers and
replay. The optimizer, the learning-rate scheduler, gradient clipping and the freeze policy's statistics stay
beside the graph, in the step loop, on the gradients the replay wrote: they see the same tensors an eager step
leaves, so nothing else in the loop changes.

Whether a layout is captured at all is the pure rule of :mod:`~elastic_pipe.orchestrator.stage.graph_choice`;
:class:`GraphedStep` is the thin shell that captures and replays, and :func:`step_record` what an epoch record says
about it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol, TypedDict, runtime_checkable

import torch
from torch import nn

from elastic_pipe.orchestrator.stage.capture import capture, capture_failure, on_side_stream, side_stream
from elastic_pipe.orchestrator.stage.graph_choice import GraphChoice, graph_pays

__all__ = ["StageRunner", "StepRecord", "step_record"]

#: Eager steps a layout runs before its capture: the first one carries lazy initialisation (cuBLAS workspaces,
#: the autograd engine's device threads, the optimizer's state) and, compiled, the compilation; the second
#: checks that nothing recompiles or allocates differently on a steady step (torch's recipe warms up a few steps).
WARMUP_STEPS = 2


class EagerStep(Protocol):
    """What :class:`GraphedStep` wraps: an eager one-stage step (a ``LocalStep``)."""

    module: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    compiled: bool
    grad_input: bool
    compile_s: float

    def step(self, x: torch.Tensor, *, target: torch.Tensor, losses: list[torch.Tensor] | None = None) -> None:
        """One eager forward and backward (gradients accumulate into ``.grad``)."""


class StageRunner(Protocol):
    """A stage's runner: a torch schedule, whose ``step(*inputs, target=, losses=)`` takes what the stage's place in
    the pipeline gets, or for one stage and one micro-batch an :class:`EagerStep` or a :class:`GraphedStep`
    (``step(x, target=, losses=)``)."""

    @property
    def step(self) -> Callable[..., object]: ...


@runtime_checkable
class CountsCompile(Protocol):
    """The optional capability of a runner that counts the compilation seconds of its steps (an :class:`EagerStep`
    and a :class:`GraphedStep` do; a torch schedule does not)."""

    compile_s: float


class StepRecord(TypedDict):
    """The epoch record's step-path fields (:func:`step_record`)."""

    cuda_graph: bool
    graph_reason: str
    capture_s: float
    compile_s: float


@contextmanager
def _forward_hooks_off(module: nn.Module) -> Iterator[None]:
    """The module's own forward hooks (the stage's forward timer) set aside: CUDA events recorded during a capture
    would never complete, and a replay runs no Python, so they could not time it anyway."""
    pre, post = dict(module._forward_pre_hooks), dict(module._forward_hooks)
    module._forward_pre_hooks.clear()
    module._forward_hooks.clear()
    try:
        yield
    finally:
        module._forward_pre_hooks.update(pre)
        module._forward_hooks.update(post)


def _no_recompile(compiled: bool) -> AbstractContextManager[object]:
    """For a compiled stage: fail fast instead of compiling inside the capture (a compile's own device work and
    synchronisation would invalidate it); the warm-up compiled everything a steady step runs."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("fail_on_recompile") if compiled and stance is not None else nullcontext()


class GraphedStep:
    """A one-stage step that runs ``eager`` for :data:`WARMUP_STEPS` steps, then captures and replays a CUDA graph.

    The step's gradients are the graph's static tensors, handed to the parameters after each replay (added where a
    parameter already holds one), so the step loop's ``zero_grad(set_to_none=True)`` and optimizer work as on
    an eager step. The loss is copied out of the graph, since the next replay overwrites it. With ``always``
    unset ("auto"), the last warm-up step is timed and the layout is captured only if it is host-bound
    (:func:`graph_pays`). If the capture is skipped or fails, the layout runs eagerly from then on and
    :attr:`failure` says why.

    Args:
        eager: the step to warm up with (and to fall back on).
        always: capture without timing the warm-up (``[train] cuda_graphs = "on"``).
        warmup: eager steps before the capture (at least 1).
    """

    def __init__(self, eager: EagerStep, *, always: bool = False, warmup: int = WARMUP_STEPS) -> None:
        if warmup < 1:
            raise ValueError(f"GraphedStep: warmup must be at least 1, got {warmup}")
        self.eager = eager
        self.module = eager.module
        self.always = always
        self._warmup = warmup
        self._stream = side_stream()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        self._loss: torch.Tensor | None = None
        self._grads: list[tuple[nn.Parameter, torch.Tensor]] = []
        #: Seconds the capture took (host wall time, device synchronised), until :func:`step_record` takes them.
        self.capture_s = 0.0
        self.failure = ""

    @property
    def captured(self) -> bool:
        """Whether steps replay the graph now."""
        return self._graph is not None

    @property
    def compile_s(self) -> float:
        """Compilation seconds inside the eager steps (the warm-up's)."""
        return self.eager.compile_s

    @compile_s.setter
    def compile_s(self, value: float) -> None:
        self.eager.compile_s = value

    def step(self, x: torch.Tensor, *, target: torch.Tensor, losses: list[torch.Tensor] | None = None) -> None:
        """One training step's forward and backward: eager while warming up, a replay afterwards."""
        if self._graph is None:
            if self.failure:
                self.eager.step(x, target=target, losses=losses)
                return
            if self._warmup > 0:
                self._warmup -= 1
                if self._warmup == 0 and not self.always:
                    self._timed_warmup(x, target, losses)
                else:
                    self._side_stream_step(x, target, losses)
                return
            self._capture(x, target)
            if self._graph is None:  # the capture failed: this step runs eagerly
                self.eager.step(x, target=target, losses=losses)
                return
        self._replay(x, target, losses)

    def _side_stream_step(self, x: torch.Tensor, target: torch.Tensor, losses: list[torch.Tensor] | None) -> None:
        on_side_stream(self._stream, lambda: self.eager.step(x, target=target, losses=losses))

    def _timed_warmup(self, x: torch.Tensor, target: torch.Tensor, losses: list[torch.Tensor] | None) -> None:
        """The last warm-up step, on an idle device: host enqueueing time against wall time decides the capture."""
        torch.cuda.synchronize(x.device)
        t0 = time.perf_counter()
        self._side_stream_step(x, target, losses)
        host = time.perf_counter() - t0
        torch.cuda.synchronize(x.device)
        choice = graph_pays(host, time.perf_counter() - t0)
        if not choice.use:
            self.failure = choice.reason

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _capture(self, x: torch.Tensor, target: torch.Tensor) -> None:
        t0 = time.perf_counter()
        params = self._params()
        held = [p.grad for p in params]
        for p in params:
            p.grad = None  # the captured backward then assigns (rather than accumulates into) the gradients
        # Casts cached by an earlier step would be read by the capture instead of re-done, and the replays would
        # use that step's weights forever; each step's autocast region starts empty, but be sure.
        torch.clear_autocast_cache()
        static_x = x.detach().clone()
        if self.eager.grad_input and static_x.is_floating_point():
            static_x.requires_grad_(True)
        static_y = target.detach().clone()
        graph = torch.cuda.CUDAGraph()

        def forward_backward() -> torch.Tensor:
            loss = self.eager.loss_fn(self.module(static_x), static_y)
            torch.autograd.backward(loss)  # what loss.backward() calls (typed; Tensor.backward is not)
            return loss

        with _forward_hooks_off(self.module), _no_recompile(self.eager.compiled):
            loss, error = capture(graph, self._stream, forward_backward)
        grads = [(p, p.grad) for p in params if p.grad is not None]
        for p, g in zip(params, held, strict=True):
            p.grad = g
        if error is not None or loss is None:
            self.failure = capture_failure(error)
            return
        self._grads = grads
        self._graph, self._x, self._y, self._loss = graph, static_x, static_y, loss.detach()
        torch.cuda.synchronize(x.device)
        self.capture_s += time.perf_counter() - t0

    def _replay(self, x: torch.Tensor, target: torch.Tensor, losses: list[torch.Tensor] | None) -> None:
        assert self._graph is not None and self._x is not None and self._y is not None and self._loss is not None
        with torch.no_grad():
            self._x.copy_(x)
            self._y.copy_(target)
        self._graph.replay()
        for p, g in self._grads:
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
        if losses is not None:
            losses.append(self._loss.clone())


def step_record(runner: StageRunner, choice: GraphChoice | None) -> StepRecord:
    """The epoch record's step-path fields, taking the capture and compile seconds measured since the last call.

    Args:
        runner: the layout's full-step runner (a :class:`GraphedStep`, a ``LocalStep`` or a torch schedule).
        choice: the layout's graph decision (``None``: none was made, a runner built elsewhere).

    Returns:
        ``cuda_graph`` (steps replay a graph), ``graph_reason`` (why not, or why the capture failed),
        ``capture_s`` and ``compile_s``.
    """
    reason = "" if choice is None else choice.reason
    capture_s, compile_s, captured = 0.0, 0.0, False
    if isinstance(runner, GraphedStep):
        if runner.failure:  # skipped by "auto" (GPU-bound) or a failed capture
            reason = runner.failure
        elif not runner.captured:
            reason = f"warming up ({WARMUP_STEPS} eager steps before the capture)"
        capture_s, captured = runner.capture_s, runner.captured
        runner.capture_s = 0.0
    if isinstance(runner, CountsCompile):
        compile_s = float(runner.compile_s)
        runner.compile_s = 0.0
    return {
        "cuda_graph": captured,
        "graph_reason": reason,
        "capture_s": capture_s,
        "compile_s": compile_s,
    }
