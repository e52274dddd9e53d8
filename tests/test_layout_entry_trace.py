"""benchmarks/layout_entry_trace.py: the profiler that counts the orchestrator files a transition visits."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from script_module import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "layout_entry_trace.py"


def _bench() -> ModuleType:
    return load_script(BENCH)


def test_the_trace_counts_files_parts_and_returns(tmp_path: Path) -> None:
    pkg = tmp_path / "orch"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("def f(g, h):\n    g()\n    h()\n    g()\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    return 1\n")
    (pkg / "sub" / "c.py").write_text("def h():\n    return 2\n")
    (tmp_path / "outside.py").write_text("def x():\n    return 3\n")
    namespaces: dict[str, dict[str, object]] = {}
    for name in ("a.py", "sub/b.py", "sub/c.py"):
        path = pkg / name
        namespaces[name] = {}
        exec(compile(path.read_text(), str(path), "exec"), namespaces[name])
    outside: dict[str, object] = {}
    exec(compile((tmp_path / "outside.py").read_text(), str(tmp_path / "outside.py"), "exec"), outside)
    f, g, h, x = namespaces["a.py"]["f"], namespaces["sub/b.py"]["g"], namespaces["sub/c.py"]["h"], outside["x"]
    trace = _bench()._trace(lambda: (x(), f(g, h)), pkg.resolve())  # type: ignore[operator]
    # the files of successive calls: a, sub/b, sub/c, sub/b (b entered again after control left it)
    assert trace["files"] == ["a.py", "sub/b.py", "sub/c.py"]
    assert trace["parts"] == ["a.py", "sub"]
    assert trace["returns"] == 1  # back to sub/b.py after leaving it; outside.py never counts
    # a.py is where the traced entry starts; one call down, its callees' files; outside.py's depth counts no file
    assert trace["files_within_calls"] == {"0": 1, "1": 3}
