"""The stage module's forward time inside a pipelined step (:class:`ForwardTimer`): forward hooks, timed with CUDA
events on a GPU. A CUDA-graph replay runs no hooks: a graphed step sets them aside while it captures
(:mod:`~elastic_pipe.orchestrator.stage.graphed_step`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TypeAlias

import torch
from torch import nn

__all__: list[str] = []  # internal: the package face exports what others use

#: A moment: a recorded CUDA event on a GPU, ``time.perf_counter()`` seconds elsewhere.
_Stamp: TypeAlias = "torch.Event | float"


def _seconds(a: _Stamp, b: _Stamp) -> float:
    """Seconds from ``a`` to ``b`` (two events, synchronised, or two host times)."""
    if isinstance(a, torch.Event) and isinstance(b, torch.Event):
        return a.elapsed_time(b) / 1e3
    assert isinstance(a, float) and isinstance(b, float), (a, b)  # one timer takes stamps of one kind
    return b - a


class ForwardTimer:
    """Measures the stage module's forward time inside the pipelined step (hooks; CUDA events on GPU).

    Only while :attr:`active`; :meth:`collect` needs the device synchronised first. ``module`` may be the modules of
    several stages a rank holds (virtual stages): their forwards never nest, and their times add up.
    """

    def __init__(self, module: nn.Module | Sequence[nn.Module], device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device
        self._pending: list[tuple[_Stamp, _Stamp]] = []
        self._open: _Stamp = 0.0
        self.active = True
        self.seconds = 0.0
        modules = [module] if isinstance(module, nn.Module) else module
        self._handles = [
            handle
            for m in modules
            for handle in (
                m.register_forward_pre_hook(lambda *_: self._begin()),
                m.register_forward_hook(lambda *_: self._end()),
            )
        ]

    def _now(self) -> _Stamp:
        if self._cuda:
            event = torch.Event(self._device, enable_timing=True)  # torch.cuda.Event's call is untyped
            event.record()  # on the current stream, as torch.cuda.Event.record()
            return event
        return time.perf_counter()

    def _begin(self) -> None:
        if self.active:
            self._open = self._now()

    def _end(self) -> None:
        if self.active:
            self._pending.append((self._open, self._now()))

    def collect(self) -> float:
        """Seconds of forward since the last call (call after the device is synchronised)."""
        total = 0.0
        for a, b in self._pending:
            total += _seconds(a, b)
        self._pending.clear()
        return total

    def remove(self) -> None:
        """Take the hooks off the module."""
        for h in self._handles:
            h.remove()
