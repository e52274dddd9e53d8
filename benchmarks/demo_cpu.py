"""The demo's numbers for README.md and docs/training.md: ``elastic-pipe demo --json --no-plot``, stamped with where
it was measured (commit, whether ``src/`` differed from it, the torch version and the device; ``_report.provenance``)
and written to ``benchmarks/results/demo_cpu.json`` (``tests/test_doc_numbers.py`` checks the docs against it).

Usage (on an idle 2-core machine; the demo's own options go after ``--``)::

    python benchmarks/demo_cpu.py [--out PATH] [-- DEMO OPTIONS]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from _report import emit, provenance  # benchmarks/gpu: where a result was measured

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS / "demo_cpu.json", help="where the stamped JSON goes")
    ap.add_argument("demo_options", nargs="*", help="options passed on to elastic-pipe demo (after --)")
    opts = ap.parse_args(argv)
    cli = "import sys; from elastic_pipe.cli import main; sys.exit(main(sys.argv[1:]))"  # elastic-pipe, this Python
    command = [sys.executable, "-c", cli, "demo", "--json", "--no-plot", *opts.demo_options]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    emit({**json.loads(done.stdout), **provenance()}, opts.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
