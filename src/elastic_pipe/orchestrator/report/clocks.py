"""Where a step's time goes: device-synchronised phase clocks and a progress bar on stderr (the stage module's
forward time: :mod:`~elastic_pipe.orchestrator.stage.forward_timer`)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import TextIO

import torch

from elastic_pipe.orchestrator.report.records import PHASES

__all__ = ["PhaseClock", "Progress", "seconds_into"]


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


def _clock_text(seconds: float) -> str:
    """``seconds`` as ``m:ss`` (or ``h:mm:ss`` from an hour on)."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """An epoch's progress on a stream (rank 0 only): a bar on a terminal, plain lines in a log file.

    On a terminal (``stream.isatty()``) one line is redrawn in place after every step: a bar, the steps done,
    steps/s and the time left. Anywhere else (a file, a pipe, a CI log) carriage returns would pile up into one
    unreadable line, so it writes a plain line every :attr:`LINE_FRACTION` of the epoch or every
    :attr:`LINE_SECONDS`, whichever comes first.

    Args:
        total: the epoch's steps.
        label: what the line starts with (``"epoch 2/6"``).
        enabled: ``False`` writes nothing (``[log] progress = false``, a quiet run, ranks but 0).
        start: steps already done when it starts (a resumed epoch): the rate counts only the steps run here.
        stream: where it writes (default ``sys.stderr``).
        clock: seconds, monotonic (a test passes a fake one).
    """

    WIDTH = 30
    #: A plain line after every tenth of the epoch...
    LINE_FRACTION = 0.1
    #: ... or after this many seconds without one, for long epochs.
    LINE_SECONDS = 30.0

    def __init__(
        self,
        total: int,
        label: str,
        *,
        enabled: bool,
        start: int = 0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled and total > start
        self.stream: TextIO = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self.start = start
        self._clock = clock
        self.t0 = clock()
        self._line_done = start
        self._line_t = self.t0
        self._line_every = max(1, math.ceil(total * self.LINE_FRACTION))
        self._width = 0

    def _status(self, done: int, now: float) -> str:
        elapsed = now - self.t0
        rate = (done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = _clock_text((self.total - done) / rate) if rate > 0 else "?"
        return f"{done}/{self.total} {rate:.1f} steps/s ETA {eta}"

    def _line_due(self, done: int, now: float) -> bool:
        return (
            done == self.total or done - self._line_done >= self._line_every or now - self._line_t >= self.LINE_SECONDS
        )

    def update(self, done: int) -> None:
        """Report that ``done`` of the epoch's steps are done."""
        if not self.enabled:
            return
        now = self._clock()
        if self.tty:
            filled = self.WIDTH * done // self.total
            bar = "#" * filled + "." * (self.WIDTH - filled)
            text = f"{self.label} [{bar}] {self._status(done, now)}"
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        elif self._line_due(done, now):
            self.stream.write(f"{self.label} {100 * done // self.total}% {self._status(done, now)}\n")
            self._line_done, self._line_t = done, now
        else:
            return
        self.stream.flush()

    def close(self) -> None:
        """Clear the bar (on a terminal), so that the epoch's summary line takes its place."""
        if self.enabled and self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


@contextlib.contextmanager
def seconds_into(phases: MutableMapping[str, float], part: str) -> Iterator[None]:
    """Add the wall seconds the block takes (whether it ends or raises) to ``phases[part]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases[part] = phases.get(part, 0.0) + time.perf_counter() - t0
