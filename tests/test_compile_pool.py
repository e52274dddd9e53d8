"""benchmarks/gpu/_compile_pool.py: the CPU time of a process's descendants, and no pool started without CUDA."""

from __future__ import annotations

import os
import signal
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


@LINUX
def test_a_busy_child_and_its_own_child_count_and_an_idle_one_does_not() -> None:
    tool = _tool()
    before = tool.descendants_cpu_seconds()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    # a child that starts a busy grandchild and waits: the grandchild counts too
    nested = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {busy!r}])\ntime.sleep(30)"
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child = subprocess.Popen([sys.executable, "-c", nested], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while tool.descendants_cpu_seconds() - before < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        used = tool.descendants_cpu_seconds() - before
        assert used >= 0.6  # the grandchild's busy 0.6 s, two levels down
        time.sleep(0.5)  # all three asleep now: nothing more is used
        assert tool.descendants_cpu_seconds() - before - used < 0.2
        assert tool.descendants_cpu_seconds(idle.pid) == 0.0  # a process with no children
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child and the grandchild
        idle.kill()
        child.wait()
        idle.wait()


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
    report = tool.warm_compile_pool(settle_s=0.5)
    assert calls == ["warm", "ready", "sleep", "sleep", "sleep"]  # idle at the third pause: no CPU since the second
    assert config.quiesce_async_compile_pool is False  # kept up for every arm
    assert report["compile_pool_s"] >= 0 and report["compile_threads"] == config.compile_threads
    assert next(reads) == 2.5  # it stopped reading once idle
