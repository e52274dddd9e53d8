"""What the GPU micro-benchmarks do with their results: print them as JSON and, given a path, write them there."""

from __future__ import annotations

import json
from pathlib import Path


def emit(report: dict[str, object], out: Path | None) -> None:
    """Print ``report`` as indented JSON; also write it to ``out`` (its folder made) unless ``None``."""
    text = json.dumps(report, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
