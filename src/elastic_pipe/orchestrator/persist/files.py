"""Checkpoint files on disk: their names, the manifests beside them, and atomic, fsynced writes.

A checkpoint is ``epoch-EEEE[-step-SSSSSS].pt`` (``torch.save`` of tensors and plain data, loaded with
``weights_only=True``) with ``epoch-...manifest.json`` beside it (the file's SHA-256 and a CRC per tensor:
:class:`Manifest`); ``latest.json`` names the newest (:class:`Latest`).
:class:`~elastic_pipe.orchestrator.persist.checkpoint.Checkpointer` decides when to save and what; this module
only names, writes and prunes the files (:mod:`.loads` reads them back, :mod:`.shards` reads the shards).

A sharded checkpoint adds one shard per pipeline stage, ``epoch-EEEE[-step-SSSSSS].stage-NNNN.shard`` (the stage's
weights and optimizer state, written by the rank that runs it: v shards by a rank holding v stages) with its own
manifest; the main file then holds
everything else and a ``shards`` table (the shard files and which shard holds each model key; with a probe-driven
freeze policy also a ``probe`` table: which shard keeps each rank's probe outputs) and each shard's SHA-256 as
its writer recorded it (:func:`shard_digests`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypedDict

import torch

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.persist.integrity import file_sha256, tensor_checksums

__all__ = [
    "FORMAT",
    "FORMATS",
    "LATEST",
    "MANIFEST_SUFFIX",
    "CorruptCheckpoint",
    "Fingerprint",
    "JsonObject",
    "Latest",
    "Manifest",
    "SavedState",
    "checkpoint_files",
    "is_inside",
    "manifest_path",
    "order_key",
    "prune",
    "read_latest",
    "read_manifest",
    "remove_leftovers",
    "run_order",
    "shard_digests",
    "shard_name",
    "write_checkpoint",
    "write_shard",
]

#: Version of the checkpoint layout; bumped on any incompatible change (3: manifests with checksums; 4: one shard
#: per stage beside the main file).
FORMAT = 4
#: Versions this package still reads (a format-3 checkpoint is one whole state in one file).
FORMATS = (3, 4)
#: Name of the side file that points at the newest checkpoint.
LATEST = "latest.json"
#: What replaces ``.pt`` in the name of a checkpoint's manifest.
MANIFEST_SUFFIX = ".manifest.json"
#: Suffix of a stage's shard of a checkpoint.
SHARD_SUFFIX = ".shard"
#: Suffix of a file being written; renamed over the real name once complete.
TMP_SUFFIX = ".tmp"
#: Names of the checkpoint files: at an epoch's end, or after some steps inside it.
_NAME = re.compile(r"epoch-(\d+)(?:-step-(\d+))?\.pt")

#: A checkpoint's state as ``torch.load(..., weights_only=True)`` gives it back: tensors and plain data, nested
#: (its shape is the writer's; a reader checks what it uses).
SavedState = dict[str, Any]
#: A JSON object as read from a manifest or ``latest.json``: not checked against :class:`Manifest` or
#: :class:`Latest` (a damaged file may hold anything); a reader checks the keys it uses.
JsonObject = dict[str, Any]


class Fingerprint(TypedDict):
    """Names and shapes of a model's parameters and buffers, in ``state_dict`` order."""

    names: list[str]
    shapes: list[list[int]]


class Latest(TypedDict, total=False):
    """``latest.json``: the newest checkpoint's file and what a resume checks before loading it (JSON)."""

    format: int
    file: str
    epoch: int
    step: int
    fingerprint: Fingerprint
    #: The config of the run that wrote it, the TOML's tables (:meth:`TrainConfig.to_dict`).
    config: dict[str, dict[str, Any]]


class Manifest(Latest, total=False):
    """A checkpoint file's or shard's manifest (JSON): :class:`Latest`'s keys (a shard's: ``format`` and ``file``
    only), the file's SHA-256 and size, and a CRC-32 per tensor by path."""

    sha256: str
    bytes: int
    tensors: dict[str, int]


class CorruptCheckpoint(ConfigError):
    """A checkpoint file that fails its manifest's checks or holds non-finite values."""


def read_latest(directory: str | Path) -> JsonObject | None:
    """The side file of the newest checkpoint in ``directory``, or ``None`` when there is none.

    Raises:
        ConfigError: the side file cannot be read, or it names a file outside ``directory``.
    """
    path = Path(directory) / LATEST
    if not path.exists():
        return None
    try:
        meta: JsonObject = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise ConfigError(f"cannot read checkpoint index {path}: {exc}") from exc
    name = meta.get("file") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not is_inside(Path(directory), name):
        raise ConfigError(f"{path}: 'file' must name a file inside {directory}, got {name!r}")
    return meta


def is_inside(directory: Path, name: str) -> bool:
    """Whether ``name`` is a plain file name that stays inside ``directory`` (no separator, no '..', no link out)."""
    if not name or name in (".", "..") or Path(name).name != name or os.sep in name or "/" in name:
        return False
    return (directory / name).resolve().parent == directory.resolve()


def shard_name(name: str, stage: int) -> str:
    """The shard of ``stage`` beside checkpoint ``name``: ``epoch-0002.pt`` -> ``epoch-0002.stage-0001.shard``.

    Not ``.pt``: a directory's ``*.pt`` files stay its checkpoints, one per save.
    """
    return f"{name.removesuffix('.pt')}.stage-{stage:04d}{SHARD_SUFFIX}"


def _shards_of(checkpoint: Path) -> list[Path]:
    """The shard files (and their manifests) beside a checkpoint file."""
    return sorted(checkpoint.parent.glob(checkpoint.name.removesuffix(".pt") + ".stage-*"))


def manifest_path(checkpoint: Path) -> Path:
    """The manifest beside a checkpoint file or shard: ``epoch-0002.pt`` -> ``epoch-0002.manifest.json``."""
    return checkpoint.with_name(checkpoint.name.removesuffix(".pt").removesuffix(SHARD_SUFFIX) + MANIFEST_SUFFIX)


def run_order(name: str) -> tuple[int, int] | None:
    """Where a checkpoint file sits in the run: (epoch, steps into it), or ``None`` for a name not ours."""
    m = _NAME.fullmatch(name)
    return None if m is None else (int(m.group(1)), int(m.group(2) or 0))


def order_key(path: Path) -> tuple[int, int]:
    """:func:`run_order` of a file :func:`checkpoint_files` listed."""
    key = run_order(path.name)
    assert key is not None  # checkpoint_files lists only names that parse
    return key


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``, oldest first."""
    found = [(key, p) for p in directory.glob("epoch-*.pt") if (key := run_order(p.name)) is not None]
    return [p for _, p in sorted(found)]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``NAME.tmp``: fsync the file before the rename and the directory after it."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    _write_atomic(path, lambda f: f.write(json.dumps(data).encode("utf-8")))


def remove_leftovers(directory: Path) -> list[Path]:
    """Delete the ``.tmp`` files a crashed save left in ``directory``; returns them."""
    left = [p for p in directory.glob("*" + TMP_SUFFIX) if p.name.startswith("epoch-") or p.name == LATEST + TMP_SUFFIX]
    for p in left:
        p.unlink(missing_ok=True)
    return left


def prune(directory: Path, keep_last: int, newest: Path) -> list[Path]:
    """Delete all but the ``keep_last`` newest checkpoints up to ``newest`` (0 keeps all); returns those deleted.

    Files after ``newest`` in the run's order (left by an attempt that failed after writing them) are not touched:
    the run overwrites them when it gets there.
    """
    if not keep_last:
        return []
    last = run_order(newest.name)
    older = [p for p in checkpoint_files(directory) if last is None or order_key(p) <= last]
    doomed = older[:-keep_last]
    for p in doomed:
        for shard in _shards_of(p):
            shard.unlink(missing_ok=True)
        manifest_path(p).unlink(missing_ok=True)
        p.unlink(missing_ok=True)
    return doomed


def write_checkpoint(directory: Path, name: str, state: dict[str, object], meta: Latest) -> Path:
    """Write ``state`` as ``directory/name`` with its manifest and point ``latest.json`` at it (no collective).

    Args:
        directory: the checkpoint directory (created if missing).
        name: the file name (``epoch-NNNN.pt`` or ``epoch-NNNN-step-SSSSSS.pt``).
        state: tensors and plain data; ``format`` is added.
        meta: what ``latest.json`` says besides ``format`` and ``file`` (epoch, step, fingerprint, config).
    """
    directory.mkdir(parents=True, exist_ok=True)
    remove_leftovers(directory)
    path = directory / name
    state["format"] = FORMAT
    checksums = tensor_checksums(state)  # of the state in memory, before serialisation
    _write_atomic(path, lambda f: torch.save(state, f))
    latest: Latest = {"format": FORMAT, "file": name, **meta}
    manifest: Manifest = {**latest, "sha256": file_sha256(path), "bytes": path.stat().st_size, "tensors": checksums}
    _write_json(manifest_path(path), manifest)
    _write_json(directory / LATEST, latest)
    return path


def write_shard(directory: Path, name: str, state: Mapping[str, object]) -> Path:
    """Write one stage's shard ``directory/name`` and its manifest (no collective; no ``latest.json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    checksums = tensor_checksums(state)
    _write_atomic(path, lambda f: torch.save(state, f))
    manifest: Manifest = {"format": FORMAT, "file": name, "sha256": file_sha256(path), "bytes": path.stat().st_size}
    _write_json(manifest_path(path), {**manifest, "tensors": checksums})
    return path


def shard_digests(directory: Path, files: list[str]) -> dict[str, str]:
    """The SHA-256 of each shard ``files`` names, from the manifests its writers just wrote (for the main file's
    shard table: a shard swapped together with its manifest then no longer matches the main file).

    Raises:
        CorruptCheckpoint: a shard's manifest is unreadable or has no SHA-256.
    """
    digests = {}
    for name in files:
        digest = read_manifest(directory / name, hash_file=False).get("sha256")
        if not isinstance(digest, str):
            raise CorruptCheckpoint(f"{directory / name}: its manifest records no SHA-256")
        digests[name] = digest
    return digests


def read_manifest(path: Path, *, hash_file: bool = True) -> JsonObject:
    """The manifest beside checkpoint file or shard ``path``, after checking the file's SHA-256 against it (unless
    not ``hash_file``).

    Raises:
        CorruptCheckpoint: no readable manifest, a missing file, or a file whose SHA-256 differs.
    """
    mpath = manifest_path(path)
    try:
        manifest: JsonObject = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise CorruptCheckpoint(f"{path}: no readable manifest {mpath.name} ({exc})") from exc
    if not isinstance(manifest, dict):
        raise CorruptCheckpoint(f"{path}: its manifest {mpath.name} is not a JSON object")
    if not hash_file:
        return manifest
    if not path.exists():
        raise CorruptCheckpoint(f"{path}: the file is missing")
    digest = file_sha256(path)
    if digest != manifest.get("sha256"):
        raise CorruptCheckpoint(f"{path}: SHA-256 {digest[:12]}... differs from the manifest's")
    return manifest
