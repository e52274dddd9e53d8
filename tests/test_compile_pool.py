"""benchmarks/gpu/_compile_pool.py: the CPU time below a process (a stand-in /proc and a real child), the pool
started, kept up and waited for with CUDA, and nothing started without."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from script_module import load_script

LINUX = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _tool() -> ModuleType:
    return load_script(Path("benchmarks/gpu/_compile_pool.py"))


def _process(proc: Path, pid: int, parent: int, utime: int, stime: int, *, name: str = "python") -> None:
    """A process as ``/proc/PID/stat`` shows it (fields 4, 14 and 15: parent, user and system ticks)."""
    fields = ["S", str(parent), *["0"] * 9, str(utime), str(stime), *["0"] * 10]
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")


def test_descendants_count_every_level_below_the_process_and_nothing_beside_it(tmp_path: Path) -> None:
    tool, tick = _tool(), os.sysconf("SC_CLK_TCK")
    _process(tmp_path, 10, 1, 5, 5)  # the process asked about: its own time is not counted
    _process(tmp_path, 11, 10, 2 * tick, tick)  # a child: 3 s
    _process(tmp_path, 12, 11, tick, 0, name="py) thon")  # its child, whose name holds a parenthesis: 1 s
    _process(tmp_path, 13, 1, 7 * tick, 0)  # beside it: not counted
    (tmp_path / "14").mkdir()  # a process gone while the table is read
    (tmp_path / "self").mkdir()  # not a process
    assert tool.descendants_cpu_seconds(10, proc=tmp_path) == pytest.approx(4.0)
    assert tool.descendants_cpu_seconds(11, proc=tmp_path) == pytest.approx(1.0)
    assert tool.descendants_cpu_seconds(12, proc=tmp_path) == 0.0


@LINUX
def test_a_busy_child_of_this_process_counts() -> None:
    tool = _tool()
    before = tool.descendants_cpu_seconds()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 30
        while tool.descendants_cpu_seconds(os.getpid()) - before < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tool.descendants_cpu_seconds() - before >= 0.5, child.poll()
    finally:
        child.kill()
        child.wait()


def test_without_cuda_nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _tool().warm_compile_pool() == {"compile_pool": "not started"}


def test_the_pool_is_started_kept_up_and_waited_for_until_its_processes_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import config
    from torch._inductor.async_compile import AsyncCompile

    tool = _tool()
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(AsyncCompile, "warm_pool", classmethod(lambda cls: calls.append("warm")))
    monkeypatch.setattr(AsyncCompile, "wait_pool_ready", classmethod(lambda cls, timeout=120: calls.append("ready")))
    monkeypatch.setattr(config, "quiesce_async_compile_pool", True)
    # the workers' CPU seconds as read after each pause: busy (importing) twice, then idle
    reads = iter([0.0, 1.0, 2.5, 2.5, 2.5])
    monkeypatch.setattr(tool, "descendants_cpu_seconds", lambda pid=None: next(reads))
    monkeypatch.setattr(tool.time, "sleep", lambda s: calls.append("sleep"))
    monkeypatch.setattr(tool, "first_compilation", lambda device: calls.append(f"compile on {device}") or 1.25)
    assert tool.warm_compile_pool(start=False) == {"compile_pool": "not started"}  # asked not to: nothing runs
    assert calls == []
    report = tool.warm_compile_pool(settle_s=0.5)
    # idle at the third pause (no CPU since the second); then the process's first compilation, on the GPU
    assert calls == ["warm", "ready", "sleep", "sleep", "sleep", "compile on cuda"]
    assert report["first_compile_s"] == 1.25
    assert config.quiesce_async_compile_pool is False  # kept up for every arm
    assert report["compile_pool_s"] >= 0 and report["compile_threads"] == config.compile_threads
    assert next(reads) == 2.5  # it stopped reading once idle


def test_the_first_compilation_compiles_runs_forward_and_backward_then_resets_dynamo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tool = _tool()
    compiled: list[torch.nn.Module] = []
    real_compile = torch.compile

    def eager_compile(module: torch.nn.Module, **kwargs: object) -> object:
        compiled.append(module)
        assert kwargs == {"dynamic": False}  # static shapes, as the arms compile
        return real_compile(module, backend="eager", dynamic=False)  # dynamo for real, no C++ compiler needed

    resets: list[int] = []
    real_reset = torch._dynamo.reset
    monkeypatch.setattr(torch, "compile", eager_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1) or real_reset())
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    seconds = tool.first_compilation(torch.device("cpu"))
    assert seconds > 0 and resets == [1]
    (module,) = compiled
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames_before  # dynamo traced a graph
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())  # a backward ran
