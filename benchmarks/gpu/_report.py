"""What the GPU benchmarks do with their results: where they were measured (:func:`provenance`), printed as JSON and
written to a path (:func:`emit`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

#: Set by ``benchmarks/gpu/headline.sh`` where the tree has no ``.git`` (a copy sent to a GPU machine): the commit
#: it was copied from and whether ``src/`` differed from it (``1``).
COMMIT_ENV, DIRTY_ENV = "ELASTIC_PIPE_COMMIT", "ELASTIC_PIPE_DIRTY"


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def provenance() -> dict[str, Any]:
    """Where a result was measured: ``commit`` (``git rev-parse HEAD``, else :data:`COMMIT_ENV`), ``dirty``
    (uncommitted changes under ``src/``, else :data:`DIRTY_ENV`), the torch version and the device."""
    commit = _git("rev-parse", "HEAD") or os.environ.get(COMMIT_ENV)
    status = _git("status", "--porcelain", "--", "src")
    dirty = bool(status) if status is not None else os.environ.get(DIRTY_ENV, "") == "1"
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"commit": commit, "dirty": dirty, "torch": torch.__version__, "device": device}


def emit(report: dict[str, object], out: Path | None) -> None:
    """Print ``report`` as indented JSON; also write it to ``out`` (its folder made) unless ``None``."""
    text = json.dumps(report, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
