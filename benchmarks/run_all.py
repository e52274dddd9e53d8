"""Run every CPU benchmark in this folder (each ``bench_*.py`` with a ``main()``), one after another."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str], here: Path = HERE) -> int:
    """Run the benchmarks named on the command line, or all of them, each with its default arguments (its own
    command line is its name alone: the names given here are not its arguments)."""
    wanted = set(argv)
    scripts = sorted(here.glob("bench_*.py"))
    for path in scripts:
        if wanted and path.stem not in wanted:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"== {path.stem}", file=sys.stderr, flush=True)
        given, sys.argv = sys.argv, [str(path)]
        try:
            module.main()
        finally:
            sys.argv = given
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
