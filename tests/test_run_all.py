"""benchmarks/run_all.py runs the benchmarks it is given by name (or all), each with its own default arguments."""

from __future__ import annotations

import sys
from pathlib import Path

from script_module import load_script

#: A benchmark that parses its command line, as the real ones do, and records that it ran.
BENCH = """import argparse, pathlib
def main():
    args = argparse.ArgumentParser().parse_args()
    (pathlib.Path(__file__).parent / (pathlib.Path(__file__).stem + ".ran")).write_text(repr(vars(args)))
"""


def test_named_benchmarks_run_with_their_default_arguments(tmp_path: Path) -> None:
    for name in ("bench_a", "bench_b"):
        (tmp_path / f"{name}.py").write_text(BENCH)
    run_all = load_script(Path("benchmarks/run_all.py"))
    argv = list(sys.argv)
    assert run_all.main(["bench_b"], here=tmp_path) == 0  # "bench_b" is not bench_b's own argument
    assert (tmp_path / "bench_b.ran").read_text() == "{}" and not (tmp_path / "bench_a.ran").exists()
    assert sys.argv == argv  # the caller's command line is back
    assert run_all.main([], here=tmp_path) == 0 and (tmp_path / "bench_a.ran").exists()
