"""Verified loads with fallback: a checkpoint is loaded only after its manifest's checks, and a directory's newest
intact checkpoint is found by trying the newer ones first.

``torch.load(..., weights_only=True)``: tensors, numbers, strings, lists and dicts only; no object is ever
unpickled. Before that a file's SHA-256 must match its manifest; after it, every tensor's CRC-32 must, and (unless
``allow_nonfinite``) every floating-point value must be finite and within
:data:`~elastic_pipe.orchestrator.persist.integrity.MAX_ABS`. A sharded checkpoint's shards are checked and read
through :mod:`.shards`. A missing or corrupt ``latest.json`` falls back to scanning the directory
(:func:`candidates`), never to a fresh start. A checkpoint of another model (its :func:`fingerprint`: the names and
shapes of the model's tensors) is refused (:func:`check_compatible`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.persist.files import (
    FORMATS,
    LATEST,
    CorruptCheckpoint,
    Fingerprint,
    JsonObject,
    SavedState,
    checkpoint_files,
    manifest_path,
    order_key,
    read_latest,
    read_manifest,
    run_order,
)
from elastic_pipe.orchestrator.persist.integrity import value_problems, verify_tensors
from elastic_pipe.orchestrator.persist.shards import attach_shards, verify_shards

__all__ = [
    "candidate_manifests",
    "candidates",
    "check_compatible",
    "find_latest",
    "fingerprint",
    "latest_meta",
    "load_latest",
    "load_verified",
    "load_weights",
]

log = logging.getLogger(__name__)


def fingerprint(model: nn.Module) -> Fingerprint:
    """Names and shapes of the model's parameters and buffers (what must match for a checkpoint to fit)."""
    state = model.state_dict()
    return {"names": list(state), "shapes": [list(t.shape) for t in state.values()]}


def check_compatible(meta: Mapping[str, Any], model: nn.Module, source: str) -> None:
    """Refuse a checkpoint made for another model.

    Args:
        meta: the checkpoint's manifest or ``latest.json`` as read (JSON, not yet checked).
        model: this run's model.
        source: what to name in the error (the file or the directory).

    Raises:
        ConfigError: if the format or the model fingerprint differs.
    """
    if meta.get("format") not in FORMATS:
        raise ConfigError(f"{source}: checkpoint format {meta.get('format')!r}, expected one of {list(FORMATS)}")
    mine = fingerprint(model)
    theirs = meta.get("fingerprint", {})
    if theirs != mine:
        names = set(theirs.get("names", []))
        diff = (
            sorted(names.symmetric_difference(mine["names"]))[:3]
            or [n for n, a, b in zip(mine["names"], mine["shapes"], theirs.get("shapes", []), strict=False) if a != b][
                :3
            ]
        )
        raise ConfigError(
            f"{source}: checkpoint is from another model ({len(names)} tensors vs {len(mine['names'])}; "
            f"first differences: {diff}); use another checkpoint directory or resume = 'never'"
        )


def load_verified(path: Path, *, allow_nonfinite: bool = False) -> tuple[SavedState, JsonObject]:
    """Load one checkpoint file after checking it against its manifest.

    A sharded checkpoint's shards are checked too (each against its manifest's SHA-256), and its ``model`` and
    optimizer ``state`` become lazy views of them (:class:`~.shards.ShardedCheckpoint`).

    Returns:
        The state and the manifest.

    Raises:
        CorruptCheckpoint: naming the file and what is wrong with it.
    """
    manifest = read_manifest(path)
    try:
        state: SavedState = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling or zip error means the same: this file cannot be used
        raise CorruptCheckpoint(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
    problems = verify_tensors(state, manifest.get("tensors", {}))
    if not allow_nonfinite:
        problems += value_problems(state)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CorruptCheckpoint(f"{path}: {'; '.join(problems[:3])}{more}")
    if "shards" in state:
        attach_shards(path, state, allow_nonfinite=allow_nonfinite)
    _as_current(state)
    return state, manifest


def _as_current(state: SavedState) -> None:
    """Read an older layout of the state as the current one: a checkpoint written before ``decision_due`` moved into
    the run's position (format 3) kept it beside ``run``."""
    run = state.get("run")
    if "decision_due" in state and isinstance(run, dict) and "decision_due" not in run:
        run["decision_due"] = bool(state.pop("decision_due"))


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], SavedState]:
    """Every model weight of checkpoint file ``path`` (whole or sharded), and the main file's state.

    The whole model is assembled here, on the CPU: for export and inspection, never for training.

    Raises:
        CorruptCheckpoint: the file or one of its shards fails its checks.
    """
    state, _ = load_verified(path, allow_nonfinite=True)
    weights = state.get("model")
    if isinstance(weights, Mapping):
        order = state.get("keys") or list(weights)
        return {k: weights[k] for k in order}, state
    return {}, state


def candidates(directory: Path, *, warn: bool) -> list[Path] | None:
    """The checkpoint files to try, in order; ``None`` when the directory holds no checkpoint (a fresh start).

    With a readable ``latest.json``: the file it names, then the older checkpoints newest first. Without one
    (missing, unreadable, not an object, pointing outside the directory): every checkpoint file, newest first,
    with a warning (``warn``) - a lost index never makes a run start afresh over its checkpoints.

    Raises:
        ConfigError: ``latest.json`` is there but unusable and no checkpoint file is left to fall back to.
    """
    files = checkpoint_files(directory)
    try:
        meta = read_latest(directory)
    except ConfigError as exc:
        if not files:
            raise ConfigError(
                f"{exc}; no checkpoint file in {directory} to fall back to (resume = 'never' starts afresh)"
            ) from None
        if warn:
            log.warning("%s; falling back to the newest intact checkpoint in %s", exc, directory)
        return files[::-1]
    if meta is None:
        if files and warn:
            log.warning(
                "%s is missing; falling back to the newest intact checkpoint in %s", directory / LATEST, directory
            )
        return files[::-1] or None
    latest = directory / meta["file"]
    last = run_order(latest.name)
    older = [p for p in reversed(files) if p != latest and (last is None or order_key(p) < last)]
    return [latest, *older]


def find_latest(
    directory: Path, *, allow_nonfinite: bool = False, warn: bool = True
) -> tuple[SavedState, JsonObject, Path] | None:
    """The newest intact checkpoint in ``directory``: its state, its manifest and the file actually loaded.

    The file ``latest.json`` names comes first; when it fails a check, the older checkpoints are tried newest
    first, each failure logged (``warn``) with the file's name and the reason. A missing or unusable
    ``latest.json`` falls back to every checkpoint file of the directory, newest first (see :func:`candidates`).
    Every check runs here, the shards' tensors included (:func:`~.shards.verify_shards`).

    Returns:
        ``(state, manifest, path)``, or ``None`` when the directory holds no checkpoint at all.

    Raises:
        ConfigError: no checkpoint is intact, or ``latest.json`` is unusable and there is none to fall back to.
    """
    paths = candidates(directory, warn=warn)
    if paths is None:
        return None
    failures = []
    for path in paths:
        try:
            state, manifest = load_verified(path, allow_nonfinite=allow_nonfinite)
            verify_shards(state)
        except CorruptCheckpoint as exc:
            failures.append(str(exc))
            if warn:
                log.warning("skipping checkpoint %s: %s", path, exc)
        else:
            return state, manifest, path
    raise ConfigError(f"no intact checkpoint in {directory}: " + " | ".join(failures))


def load_latest(
    directory: Path, *, allow_nonfinite: bool = False, warn: bool = True
) -> tuple[SavedState, JsonObject] | None:
    """:func:`find_latest` without the path: the newest intact checkpoint's state and manifest, or ``None``."""
    found = find_latest(directory, allow_nonfinite=allow_nonfinite, warn=warn)
    return None if found is None else found[:2]


def candidate_manifests(directory: str | Path) -> list[JsonObject]:
    """What a resume from ``directory`` checks the model and the config against, without loading a checkpoint: the
    readable manifests of the checkpoints :func:`find_latest` would try, in that order (each repeats
    ``latest.json``'s format, fingerprint and config), else ``latest.json`` itself; ``[]`` when there is no
    checkpoint.

    Raises:
        ConfigError: ``latest.json`` is unusable and there is no checkpoint file to fall back to.
    """
    directory = Path(directory)
    paths = candidates(directory, warn=False)
    if paths is None:
        return []
    found: list[JsonObject] = []
    for path in paths:
        try:
            manifest = json.loads(manifest_path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict):
            found.append(manifest)
    if found:
        return found
    try:
        latest = read_latest(directory)
    except ConfigError:
        return []  # no usable index, no readable manifest: the resume names every file that failed
    return [] if latest is None else [latest]


def latest_meta(directory: str | Path) -> JsonObject | None:
    """The first of :func:`candidate_manifests` (``None`` when there is no checkpoint)."""
    manifests = candidate_manifests(directory)
    return manifests[0] if manifests else None
