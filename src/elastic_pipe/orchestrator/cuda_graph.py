"""CUDA-graph training steps: a layout's forward, loss and backward captured once and replayed every step.

A step whose layers are nearly all frozen (the head-only layout, or a short stage behind the activation cache)
does about a millisecond of GPU work and several of Python and kernel launches: the host sets the pace. A CUDA
graph replays the whole forward + loss + backward with one launch. The recipe is torch's documented whole-network
capture (``torch.cuda.graph``): warm up eagerly on a side stream, capture once with static input buffers, then per
step copy the new batch into those buffers and replay. The optimizer, the learning-rate scheduler, gradient
clipping and the freeze policy's statistics stay beside the graph, in the step loop, on the gradients the replay
wrote: they see the same tensors an eager step leaves, so nothing else in the loop changes.

Two parts: :func:`decide_graph` is the pure rule (is capture safe for this layout and step size, and if not,
why), unit-tested on the CPU; :class:`GraphedStep` is the thin shell that captures and replays. :func:`capture`
is the capture recipe itself, shared with the probe's forward graphs (:mod:`.forward_graphs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

__all__ = [
    "HOST_BOUND_FRACTION",
    "WARMUP_STEPS",
    "EagerStep",
    "GraphChoice",
    "GraphedStep",
    "capture",
    "capture_failure",
    "decide_graph",
    "graph_pays",
    "step_record",
]

T = TypeVar("T")

#: Eager steps a layout runs before its capture: the first one carries lazy initialisation (cuBLAS workspaces,
#: the autograd engine's device threads, the optimizer's state) and, compiled, the compilation; the second
#: checks that nothing recompiles or allocates differently on a steady step (torch's recipe warms up a few steps).
WARMUP_STEPS = 2


@dataclass(frozen=True)
class GraphChoice:
    """Whether a layout's steps of one size replay a CUDA graph.

    Attributes:
        use: capture and replay.
        reason: why not (empty when ``use``); reported in the epoch record's ``graph_reason``.
    """

    use: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if self.use == bool(self.reason):
            raise ValueError(f"GraphChoice: give a reason exactly when use is False, got {self!r}")


def decide_graph(
    mode: str,
    *,
    device_type: str,
    pipe_len: int,
    microbatches: int,
    replicas: int,
    rows: int,
    full_rows: int,
) -> GraphChoice:
    """Whether steps of ``rows`` samples in this layout can replay a CUDA graph (``[train] cuda_graphs``).

    A graph fixes shapes, memory and the host's part of the step, so it is used only where the step is one
    direct forward + backward on a device that has graphs:

    * one stage and one micro-batch (the :class:`~elastic_pipe.orchestrator.stage.LocalStep` path): a pipelined
      schedule sends activations between ranks and keeps per-step bookkeeping in Python, which a graph would
      freeze;
    * one replica: several replicas average gradients in hooks that fire during the backward (gloo cannot be
      captured, and the hooks' bucketing is host logic);
    * a full step: a short last step has other shapes (it runs eagerly, as before).

    Args:
        mode: ``"auto"``, ``"on"`` or ``"off"`` (both "auto" and "on" apply these rules, and "auto" then also
            asks :func:`graph_pays` after the warm-up; "off" never captures).
        device_type: the rank's device type (``"cuda"``, ``"cpu"``, ...).
        pipe_len: the layout's pipeline length.
        microbatches: micro-batches per step.
        replicas: data-parallel replicas.
        rows: samples per micro-batch of this step.
        full_rows: samples per micro-batch of a full step.

    Returns:
        The choice, with the first reason that rules capture out.
    """
    if mode == "off":
        return GraphChoice(False, "off ([train] cuda_graphs)")
    if device_type != "cuda":
        return GraphChoice(False, f"CUDA graphs need a CUDA device, not {device_type}")
    if pipe_len > 1 or microbatches > 1:
        return GraphChoice(
            False, f"a pipelined schedule (pipe_len={pipe_len}, microbatches={microbatches}) runs host logic per step"
        )
    if replicas > 1:
        return GraphChoice(False, f"{replicas} replicas average gradients in backward hooks")
    if rows != full_rows:
        return GraphChoice(False, f"a short step of {rows} rows (full steps have {full_rows}) has other shapes")
    return GraphChoice(True)


#: ``"auto"`` captures a layout only if its measured warm-up step is host-bound: the host's enqueueing took at least
#: this fraction of the step's wall time, so the GPU waited on Python and launches for part of it. Below it the
#: GPU sets the pace and a replay would save no time, only hold a second copy of the step's activations (on one
#: H200, ViT-B/16 steps with a block or more to train measured 0.05 to 0.4 of their wall time in host work; the
#: head-only step 0.9, see docs/benchmarks.md).
HOST_BOUND_FRACTION = 0.5


def graph_pays(host_s: float, wall_s: float) -> GraphChoice:
    """Whether a capture pays for a step that took ``wall_s`` seconds (device synchronised) of which the host
    spent ``host_s`` enqueueing it (``"auto"``; see :data:`HOST_BOUND_FRACTION`)."""
    if wall_s > 0 and host_s >= HOST_BOUND_FRACTION * wall_s:
        return GraphChoice(True)
    return GraphChoice(
        False, f"GPU-bound: {host_s * 1e3:.1f} ms of host work in a {wall_s * 1e3:.1f} ms step (auto needs half)"
    )


class EagerStep(Protocol):
    """What :class:`GraphedStep` wraps: an eager one-stage step (a ``LocalStep``)."""

    module: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    compiled: bool
    grad_input: bool
    compile_s: float

    def step(self, x: torch.Tensor, *, target: torch.Tensor, losses: list[torch.Tensor] | None = None) -> None:
        """One eager forward and backward (gradients accumulate into ``.grad``)."""


def capture(
    graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, body: Callable[[], T]
) -> tuple[T | None, BaseException | None]:
    """Record ``body()`` into ``graph`` on ``stream``: the capture recipe every CUDA graph here is made with.

    torch.cuda.graph() would also collect garbage and empty the allocator's cache first, which costs more than a
    short layout's capture saves; capturing directly skips that. thread_local: a data loader's pinning thread may
    touch CUDA while this thread captures.

    Returns:
        ``(body's result, None)``; or ``(None, error)`` when ``body`` raised (any failure inside a capture means:
        run eagerly) or ending the capture failed, the first error kept.
    """
    result: T | None = None
    error: BaseException | None = None
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            result = body()
        except Exception as e:  # any failure inside a capture means: run eagerly
            error = e
        finally:
            try:
                graph.capture_end()
            except RuntimeError as e:
                error = error or e
    return (None, error) if error is not None else (result, None)


def capture_failure(error: BaseException | None) -> str:
    """The reason a failed capture leaves its layout or segment eager: the error's first line (or its type)."""
    text = str(error).splitlines()[0] if error is not None and str(error) else type(error).__name__
    return f"capture failed: {text}"


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


def _no_recompile(compiled: bool) -> AbstractContextManager[Any]:
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
        self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch stub
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
        main = torch.cuda.current_stream()
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            self.eager.step(x, target=target, losses=losses)
        main.wait_stream(self._stream)

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
        main = torch.cuda.current_stream()
        self._stream.wait_stream(main)

        def forward_backward() -> torch.Tensor:
            loss = self.eager.loss_fn(self.module(static_x), static_y)
            loss.backward()  # type: ignore[no-untyped-call]  # torch stub
            return loss

        with _forward_hooks_off(self.module), _no_recompile(self.eager.compiled):
            loss, error = capture(graph, self._stream, forward_backward)
        main.wait_stream(self._stream)
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


def step_record(runner: Any, choice: GraphChoice | None) -> dict[str, Any]:
    """The epoch record's step-path fields, taking the capture and compile seconds measured since the last call.

    Args:
        runner: the layout's full-step runner (a :class:`GraphedStep`, a ``LocalStep`` or a torch schedule).
        choice: the layout's graph decision (``None``: none was made, a runner built elsewhere).

    Returns:
        ``cuda_graph`` (steps replay a graph), ``graph_reason`` (why not, or why the capture failed),
        ``capture_s`` and ``compile_s``.
    """
    graphed = isinstance(runner, GraphedStep)
    reason = "" if choice is None else choice.reason
    if graphed and runner.failure:  # skipped by "auto" (GPU-bound) or a failed capture
        reason = runner.failure
    elif graphed and not runner.captured:
        reason = f"warming up ({WARMUP_STEPS} eager steps before the capture)"
    capture_s = runner.capture_s if graphed else 0.0
    compile_s = float(getattr(runner, "compile_s", 0.0))
    if graphed:
        runner.capture_s = 0.0
    if hasattr(runner, "compile_s"):
        runner.compile_s = 0.0
    return {
        "cuda_graph": graphed and runner.captured,
        "graph_reason": reason,
        "capture_s": capture_s,
        "compile_s": compile_s,
    }
