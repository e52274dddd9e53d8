"""A test helper: one checkpoint of a run's directory copied alone into another, named the newest there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def copy_checkpoint(source: Path, target: Path, name: str) -> None:
    """Put checkpoint ``name`` (main file, shards, manifests) of ``source`` alone in ``target`` and name it newest."""
    target.mkdir(parents=True)
    for part in source.glob(f"{name}.*"):
        shutil.copy(part, target / part.name)
    meta = json.loads((source / "latest.json").read_text())
    main = json.loads((source / f"{name}.manifest.json").read_text())
    meta.update(file=f"{name}.pt", epoch=main["epoch"], step=main["step"])
    (target / "latest.json").write_text(json.dumps(meta))
