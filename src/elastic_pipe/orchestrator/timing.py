"""Where a step's time goes: device-synchronised phase clocks, forward-hook timers, a progress bar on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from elastic_pipe.orchestrator.metrics import PHASES

__all__ = ["ForwardTimer", "PhaseClock", "Progress"]


class PhaseClock:
    """Accumulates seconds per phase over the steps it times.

    On a GPU a timed step synchronises the device at every phase edge, so that GPU time lands in its phase;
    an untimed step (``start(timed=False)``) costs nothing and adds nothing, letting the host queue work ahead.
    """

    def __init__(self, device: torch.device, phases: Sequence[str] = PHASES) -> None:
        self._cuda = device.type == "cuda"
        self.totals = dict.fromkeys(phases, 0.0)
        self.timed_steps = 0
        self._timing = False
        self._t = 0.0

    def start(self, *, timed: bool = True) -> None:
        """Begin a step; ``timed=False`` makes every :meth:`lap` of the step a no-op."""
        self._timing = timed
        if not timed:
            return
        self.timed_steps += 1
        if self._cuda:
            torch.cuda.synchronize()
        self._t = time.perf_counter()

    def lap(self, phase: str) -> float:
        """Close ``phase`` at now; returns its seconds (0 in an untimed step)."""
        if not self._timing:
            return 0.0
        if self._cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        spent = now - self._t
        self.totals[phase] += spent
        self._t = now
        return spent


class ForwardTimer:
    """Measures the stage module's forward time inside the pipelined step (hooks; CUDA events on GPU).

    Only while :attr:`active`; :meth:`collect` needs the device synchronised first.
    """

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._pending: list[tuple[Any, Any]] = []
        self._open: Any = None
        self.active = True
        self.seconds = 0.0
        self._handles = [
            module.register_forward_pre_hook(lambda *_: self._begin()),
            module.register_forward_hook(lambda *_: self._end()),
        ]

    def _now(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
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
            total += a.elapsed_time(b) / 1e3 if self._cuda else b - a
        self._pending.clear()
        return total

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


class Progress:
    """A one-line progress bar on stderr (rank 0 only)."""

    WIDTH = 30

    def __init__(self, total: int, label: str, *, enabled: bool) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled and total > 0
        self.t0 = time.perf_counter()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * done // self.total
        rate = done / max(time.perf_counter() - self.t0, 1e-9)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        sys.stderr.write(f"\r{self.label} [{bar}] {done}/{self.total} {rate:.1f} steps/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * (len(self.label) + self.WIDTH + 40) + "\r")
            sys.stderr.flush()
