"""Progress: a redrawn bar with steps/s and ETA on a terminal, plain periodic lines elsewhere, nothing when off."""

from __future__ import annotations

import io

from elastic_pipe.orchestrator.report import Progress


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _run(tty: bool, total: int, seconds_per_step: float, *, start: int = 0, enabled: bool = True) -> str:
    stream, clock = FakeStream(tty), FakeClock()
    progress = Progress(total, "epoch 1/2", enabled=enabled, start=start, stream=stream, clock=clock)
    for done in range(start + 1, total + 1):
        clock.now += seconds_per_step
        progress.update(done)
    progress.close()
    return stream.getvalue()


def test_terminal_bar_redraws_one_line_with_rate_and_eta() -> None:
    out = _run(True, 4, 0.5)
    frames = out.split("\r")
    assert "\n" not in out
    assert frames[1] == "epoch 1/2 [#######.......................] 1/4 2.0 steps/s ETA 0:02"
    assert frames[4] == "epoch 1/2 [##############################] 4/4 2.0 steps/s ETA 0:00"
    assert frames[-2:] == [" " * len(frames[4]), ""]  # close() wipes the bar for the epoch's summary line


def test_shorter_frame_overwrites_a_longer_one() -> None:
    stream, clock = FakeStream(True), FakeClock()
    progress = Progress(200, "e", enabled=True, stream=stream, clock=clock)
    clock.now += 0.001
    progress.update(1)
    clock.now += 0.999
    progress.update(2)
    first, second = stream.getvalue().split("\r")[1:]
    assert first == "e [..............................] 1/200 1000.0 steps/s ETA 0:00"
    assert second == "e [..............................] 2/200 2.0 steps/s ETA 1:39".ljust(len(first))


def test_plain_lines_every_tenth_without_carriage_returns() -> None:
    out = _run(False, 20, 1.0)
    lines = out.splitlines()
    assert "\r" not in out
    assert len(lines) == 10
    assert lines[0] == "epoch 1/2 10% 2/20 1.0 steps/s ETA 0:18"
    assert lines[-1] == "epoch 1/2 100% 20/20 1.0 steps/s ETA 0:00"


def test_plain_lines_every_30_seconds_in_a_long_epoch() -> None:
    lines = _run(False, 1000, 4.0)[:400].splitlines()
    # every 100 steps (10%) would be 400 s apart: a line comes every 30 s (8 steps of 4 s) instead
    assert lines[0] == "epoch 1/2 0% 8/1000 0.2 steps/s ETA 1:06:08"
    assert lines[1].startswith("epoch 1/2 1% 16/1000 ")


def test_resumed_epoch_counts_only_the_steps_run_here() -> None:
    lines = _run(False, 10, 2.0, start=6).splitlines()
    assert lines[0] == "epoch 1/2 70% 7/10 0.5 steps/s ETA 0:06"


def test_disabled_or_nothing_to_do_writes_nothing() -> None:
    assert _run(True, 5, 1.0, enabled=False) == ""
    assert _run(False, 5, 1.0, enabled=False) == ""
    assert _run(True, 0, 1.0) == ""
    assert _run(True, 5, 1.0, start=5) == ""
