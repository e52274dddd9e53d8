"""What the GPU benchmarks do with their results: where they were measured (:func:`provenance`), printed as JSON and
written to a path (:func:`emit`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

#: Set where the tree's ``.git`` does not describe it (a copy sent to a GPU machine may carry a stale one): the
#: commit it was copied from and whether ``src/`` differed from it (``1``). They win over ``git`` when set.
COMMIT_ENV, DIRTY_ENV = "ELASTIC_PIPE_COMMIT", "ELASTIC_PIPE_DIRTY"


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _source() -> tuple[str | None, bool]:
    """The commit and whether ``src/`` differed from it, from the environment (:data:`COMMIT_ENV`, :data:`DIRTY_ENV`)
    or else from ``git``."""
    commit = os.environ.get(COMMIT_ENV) or _git("rev-parse", "HEAD")
    if DIRTY_ENV in os.environ:
        return commit, os.environ[DIRTY_ENV] == "1"
    status = _git("status", "--porcelain", "--", "src")
    return commit, bool(status) if status is not None else True


#: Read once, when a benchmark imports this module at its start: a commit or checkout made while a long job runs
#: changes the tree on disk, not the code the job runs, so the report names the code's.
_SOURCE = _source()


def provenance() -> dict[str, Any]:
    """Where a result was measured: ``commit`` and ``dirty`` as they were when the process started (see
    :data:`_SOURCE`), the torch version and the device."""
    commit, dirty = _SOURCE
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"commit": commit, "dirty": dirty, "torch": torch.__version__, "device": device}


def emit(report: dict[str, object], out: Path | None) -> None:
    """Print ``report`` as indented JSON; also write it to ``out`` (its folder made) unless ``None``."""
    text = json.dumps(report, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
