"""CUDA-graph replay of the freeze probe's forwards: each segment of sub-layers the probe runs (one freeze unit, or
the part of one on a stage) captured once for its input shape and replayed at every later decision point.

The probe of a probe-driven policy (:class:`~elastic_pipe.freeze.Drift`, :mod:`.probe`) runs 16 samples through
the watched units in eval mode, without gradients: a few hundred tiny kernels whose launches set the pace. On one
H200 the eager probe took 3.5 ms through MiniLM-L6's 6 blocks and 5.1 ms through a 12-block width-192 ViT, of
which the GPU worked 0.7-0.8 ms; replayed as one graph per unit it took those 0.7-0.8 ms (with 0.07-0.13 ms of host
work), and its outputs were bitwise those of the eager forward (``docs/freeze.md``, "What the signals cost").

One graph per segment, not one per layout: the frozen boundary moves at a transition, and a graph per unit lets
the probe start from any boundary without a new capture. The recipe is torch's (``torch.cuda.graph``, written once
in :mod:`.capture`): the first call of a segment runs eagerly on a side stream (the warm-up: lazy initialisation
happens outside a capture), the second captures it on that stream with a static input buffer (autocast's
weight-cast cache off, so every replay casts the current weights) and replays it; later calls copy the input in and
replay. Modules are put in eval mode (and back) only for the eager and captured calls: a replay runs no Python, and
switching a whole model's modes costs about as much as the replay itself. Whatever fails to capture runs eagerly
from then on, and :attr:`ForwardGraphs.failures` says why.

A graph reads the parameters' memory, not the modules: update parameters in place (an optimizer step, freezing,
``load_state_dict``), or start a new :class:`ForwardGraphs` when modules are rebuilt (the trainer keeps one per
stage, which a transition rebuilds). A segment's output is a static tensor that its next replay overwrites: copy
it to keep it (:meth:`elastic_pipe.freeze.OutputDrift.measure` does).

Memory: each segment's graph keeps a private memory pool holding its activations for the captured input, so the
graphs of a stage together hold about what one forward of the probe batch through the stage would hold if nothing
were freed along the way (the 16-sample probe: a few percent of a training step's activations at ViT-B/16's batch
512, but several times a micro-batch's for a long-sequence model trained at one or two sequences per micro-batch).
Sharing one pool across a stage's segments (they always replay in the order they were captured) would bound it by
one segment's activations plus the outputs; until then, ``[train] cuda_graphs = "off"`` runs the probe eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from elastic_pipe.orchestrator.stage.capture import capture, capture_failure, on_side_stream, side_stream

__all__: list[str] = []  # internal: the package face exports what others use


@contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode, each of its modules' own mode put back after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    input: torch.Tensor
    output: torch.Tensor


class ForwardGraphs:
    """No-grad forwards of fixed-shape segments, each captured once as a CUDA graph and replayed (CUDA only).

    Example::

        graphs = ForwardGraphs(torch.device("cuda"), autocast_dtype=torch.bfloat16)
        h = probe
        for u in range(first, watched):                           # at every decision point
            h = graphs.run(u, h, lambda u=u: model.unit(u))       # eager, then captured, then replayed
            outputs[u] = h                                        # overwritten by unit u's next replay

    Args:
        device: where the segments run; on anything but CUDA every call runs eagerly.
        autocast_dtype: the forward's autocast dtype (``None``: no autocast). The segments run in it: do not wrap
            :meth:`run` in an autocast of your own (its weight-cast cache would be read by a capture).
        enabled: ``False`` runs every call eagerly (the trainer's ``[train] cuda_graphs = "off"``).
    """

    def __init__(
        self, device: torch.device, *, autocast_dtype: torch.dtype | None = None, enabled: bool = True
    ) -> None:
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.enabled = enabled and device.type == "cuda"
        self._stream = side_stream(device) if self.enabled else None
        self._captured: dict[Hashable, _Captured] = {}
        self._warm: set[Hashable] = set()
        #: Segments (key, input shape, dtype) that run eagerly because their capture failed, and why.
        self.failures: dict[Hashable, str] = {}
        #: Seconds spent capturing (host wall time, device synchronised), and the number of captures.
        self.capture_s = 0.0
        self.captures = 0

    @property
    def replaying(self) -> int:
        """How many segments replay a graph now."""
        return len(self._captured)

    def clear(self) -> None:
        """Drop every graph (their memory goes back to the allocator): the next calls warm up and capture anew."""
        self._captured.clear()
        self._warm.clear()
        self.failures.clear()

    def _autocast(self, *, cache: bool = True) -> torch.autocast:
        dtype = self.autocast_dtype
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None, cache_enabled=cache)

    @torch.no_grad()
    def run(self, key: Hashable, x: torch.Tensor, build: Callable[[], nn.Module]) -> torch.Tensor:
        """The segment's output on ``x``: its forward in eval mode without gradients under the autocast dtype, run
        eagerly the first time the segment (``key`` with ``x``'s shape and dtype) is seen, captured and replayed
        the second time, replayed afterwards.

        Args:
            key: names the segment (e.g. its unit index or sub-layer range); ``build`` must give the same modules
                each time the key is given.
            x: the segment's input, on :attr:`device`.
            build: returns the segment's module; called only when the segment runs eagerly or is captured, which
                is also the only time its modules are put in eval mode (each module's own mode is put back after,
                so a replay - which runs no Python - costs no mode switch).

        Returns:
            The segment's output; once replaying, a static tensor that the segment's next replay overwrites.
        """
        segment = (key, tuple(x.shape), x.dtype)
        captured = self._captured.get(segment)
        if captured is None:
            if not self.enabled or segment in self.failures:
                return self._eager(build(), x)
            if segment not in self._warm:
                self._warm.add(segment)
                return self._on_side_stream(build(), x)
            captured = self._capture(segment, build(), x)
            if captured is None:
                return self._eager(build(), x)
        captured.input.copy_(x)
        captured.graph.replay()
        return captured.output

    def _eager(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with _eval_mode(module), self._autocast():
            out: torch.Tensor = module(x)  # a module's output is untyped
        return out

    def _on_side_stream(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        assert self._stream is not None
        return on_side_stream(self._stream, lambda: self._eager(module, x), self.device)

    def _capture(self, segment: Hashable, module: nn.Module, x: torch.Tensor) -> _Captured | None:
        assert self._stream is not None
        t0 = time.perf_counter()
        static_x = x.detach().clone()
        graph = torch.cuda.CUDAGraph()

        def forward() -> object:  # a module's output is untyped: checked below
            with _eval_mode(module), self._autocast(cache=False):
                return module(static_x)

        out, error = capture(graph, self._stream, forward, self.device)  # a failure: this segment runs eagerly
        if error is None and not isinstance(out, torch.Tensor):
            error = TypeError(f"the segment returned {type(out).__name__}, not a tensor")
        if error is not None or not isinstance(out, torch.Tensor):
            self.failures[segment] = capture_failure(error)
            return None
        captured = _Captured(graph, static_x, out)
        self._captured[segment] = captured
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        self.captures += 1
        return captured
