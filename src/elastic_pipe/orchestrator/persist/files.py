"""Checkpoint files on disk: atomic, fsynced writes, manifests with checksums, verified loads with fallback.

A checkpoint is ``epoch-EEEE[-step-SSSSSS].pt`` (``torch.save`` of tensors and plain data, loaded with
``weights_only=True``) with ``epoch-...manifest.json`` beside it (the file's SHA-256 and a CRC per tensor);
``latest.json`` names the newest. :class:`~elastic_pipe.orchestrator.checkpoint.Checkpointer` decides when to
save and what; this module only writes and reads.

A sharded checkpoint adds one shard per pipeline stage, ``epoch-EEEE[-step-SSSSSS].stage-NNNN.pt`` (the stage's
weights and optimizer state, written by the rank that runs it) with its own manifest; the main file then holds
everything else and a ``shards`` table (the shard files and which shard holds each model key; with a probe-driven
freeze policy also a ``probe`` table: which shard keeps each stage's probe outputs) and each shard's SHA-256 as
its writer recorded it. Loading checks every shard's SHA-256 against its manifest and against the main file's
record (a shard swapped together with its manifest is refused) before anything is used, and wraps the shards in a
:class:`ShardedCheckpoint`, which reads a tensor only when asked for it (the files are memory-mapped), checking its
CRC-32 and its values then. Before a resume decides on a checkpoint, :func:`verify_shards` reads every tensor of a
share of the shards (each rank its own share) and checks them all, so no check fails after the decision.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.integrity import file_sha256, tensor_checksums, value_problems, verify_tensors

__all__ = [
    "FORMAT",
    "FORMATS",
    "LATEST",
    "MANIFEST_SUFFIX",
    "CorruptCheckpoint",
    "ShardedCheckpoint",
    "candidate_manifests",
    "candidates",
    "checkpoint_files",
    "find_latest",
    "latest_meta",
    "load_latest",
    "load_verified",
    "load_weights",
    "manifest_path",
    "prune",
    "read_latest",
    "remove_leftovers",
    "shard_digests",
    "shard_name",
    "verify_shards",
    "write_checkpoint",
    "write_shard",
]

log = logging.getLogger(__name__)

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


class CorruptCheckpoint(ConfigError):
    """A checkpoint file that fails its manifest's checks or holds non-finite values."""


def read_latest(directory: str | Path) -> dict[str, Any] | None:
    """The side file of the newest checkpoint in ``directory``, or ``None`` when there is none.

    Raises:
        ConfigError: the side file cannot be read, or it names a file outside ``directory``.
    """
    path = Path(directory) / LATEST
    if not path.exists():
        return None
    try:
        meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise ConfigError(f"cannot read checkpoint index {path}: {exc}") from exc
    name = meta.get("file") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not _inside(Path(directory), name):
        raise ConfigError(f"{path}: 'file' must name a file inside {directory}, got {name!r}")
    return meta


def _inside(directory: Path, name: str) -> bool:
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


def _order(name: str) -> tuple[int, int] | None:
    """Where a checkpoint file sits in the run: (epoch, steps into it), or ``None`` for a name not ours."""
    m = _NAME.fullmatch(name)
    return None if m is None else (int(m.group(1)), int(m.group(2) or 0))


def _key(path: Path) -> tuple[int, int]:
    key = _order(path.name)
    assert key is not None  # checkpoint_files lists only names that parse
    return key


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``, oldest first."""
    found = [(key, p) for p in directory.glob("epoch-*.pt") if (key := _order(p.name)) is not None]
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


def _write_json(path: Path, data: dict[str, Any]) -> None:
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
    last = _order(newest.name)
    older = [p for p in checkpoint_files(directory) if last is None or _key(p) <= last]
    doomed = older[:-keep_last]
    for p in doomed:
        for shard in _shards_of(p):
            shard.unlink(missing_ok=True)
        manifest_path(p).unlink(missing_ok=True)
        p.unlink(missing_ok=True)
    return doomed


def write_checkpoint(directory: Path, name: str, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` as ``directory/name`` with its manifest and point ``latest.json`` at it (no collective).

    Args:
        directory: the checkpoint directory (created if missing).
        name: the file name (``epoch-NNNN.pt`` or ``epoch-NNNN-step-SSSSSS.pt``).
        state: tensors and plain data; ``format`` is added.
        meta: what ``latest.json`` says besides ``format`` and ``file`` (epoch, step, fingerprint).
    """
    directory.mkdir(parents=True, exist_ok=True)
    remove_leftovers(directory)
    path = directory / name
    state["format"] = FORMAT
    checksums = tensor_checksums(state)  # of the state in memory, before serialisation
    _write_atomic(path, lambda f: torch.save(state, f))
    latest = {"format": FORMAT, "file": name, **meta}
    manifest = {**latest, "sha256": file_sha256(path), "bytes": path.stat().st_size, "tensors": checksums}
    _write_json(manifest_path(path), manifest)
    _write_json(directory / LATEST, latest)
    return path


def write_shard(directory: Path, name: str, state: dict[str, Any]) -> Path:
    """Write one stage's shard ``directory/name`` and its manifest (no collective; no ``latest.json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    checksums = tensor_checksums(state)
    _write_atomic(path, lambda f: torch.save(state, f))
    manifest = {"format": FORMAT, "file": name, "sha256": file_sha256(path), "bytes": path.stat().st_size}
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
        digest = _read_manifest(directory / name, hash_file=False).get("sha256")
        if not isinstance(digest, str):
            raise CorruptCheckpoint(f"{directory / name}: its manifest records no SHA-256")
        digests[name] = digest
    return digests


def _read_manifest(path: Path, *, hash_file: bool = True) -> dict[str, Any]:
    mpath = manifest_path(path)
    try:
        manifest: dict[str, Any] = json.loads(mpath.read_text(encoding="utf-8"))
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


class ShardedCheckpoint:
    """The shards of one checkpoint, read tensor by tensor (memory-mapped; nothing is read until asked for).

    ``model`` and ``optimizer_state`` are mappings by model key and parameter name, the shape
    :func:`elastic_pipe.orchestrator.snapshot.restore` reads; every tensor handed out has passed its CRC-32 and
    (unless ``allow_nonfinite``) the value checks.

    Args:
        directory: where the shards are.
        index: ``{model key: shard file name}``.
        manifests: each shard's manifest, by file name (already checked against the file's SHA-256).
        allow_nonfinite: accept NaN, infinite and huge values.
    """

    def __init__(
        self, directory: Path, index: dict[str, str], manifests: dict[str, dict[str, Any]], *, allow_nonfinite: bool
    ) -> None:
        self.directory = directory
        self.index = index
        self.manifests = manifests
        self.allow_nonfinite = allow_nonfinite
        self._open: dict[str, dict[str, Any]] = {}
        self.model = _ShardView(self, "model")
        self.optimizer_state = _ShardView(self, "optimizer")

    def shard(self, name: str) -> dict[str, Any]:
        """The contents of shard ``name``, memory-mapped (``weights_only``)."""
        if name not in self._open:
            path = self.directory / name
            try:
                self._open[name] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as exc:  # any unpickling or zip error means the same: this file cannot be used
                raise CorruptCheckpoint(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
        return self._open[name]

    def verify(self, name: str) -> None:
        """Read every tensor of shard ``name`` and check it: its CRC-32 against the manifest (none missing, none
        added) and (unless ``allow_nonfinite``) its values.

        Raises:
            CorruptCheckpoint: naming the shard and what is wrong with it.
        """
        contents = self.shard(name)
        problems = verify_tensors(contents, self.manifests[name].get("tensors", {}))
        if not self.allow_nonfinite:
            problems += value_problems(contents)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise CorruptCheckpoint(f"{self.directory / name}: {'; '.join(problems[:3])}{more}")

    def checked(self, shard: str, path: str, value: Any) -> Any:
        """``value`` (a tensor or a dict of them) at ``path`` of ``shard`` after its CRC-32 and value checks.

        Raises:
            CorruptCheckpoint: naming the shard and the tensor.
        """
        expected = self.manifests[shard].get("tensors", {})
        actual = tensor_checksums(value, path)
        problems = [f"tensor {p!r} fails its CRC-32" for p, crc in actual.items() if expected.get(p) != crc]
        if not self.allow_nonfinite:
            problems += value_problems({path: value} if isinstance(value, torch.Tensor) else value)
        if problems:
            raise CorruptCheckpoint(f"{self.directory / shard}: {'; '.join(problems[:3])}")
        return value


class _ShardView(Mapping[str, Any]):
    """One part of a sharded checkpoint (``model`` tensors or ``optimizer`` states) as a mapping."""

    def __init__(self, owner: ShardedCheckpoint, part: str) -> None:
        self.owner = owner
        self.part = part

    def _find(self, key: str) -> tuple[str, Any] | None:
        shard = self.owner.index.get(key)
        if shard is None:
            return None
        table = self.owner.shard(shard).get("model" if self.part == "model" else "optimizer", {})
        if self.part != "model":
            table = table.get("state", {})
        return (shard, table[key]) if key in table else None

    def __getitem__(self, key: str) -> Any:
        found = self._find(key)
        if found is None:
            raise KeyError(key)
        shard, value = found
        prefix = "model" if self.part == "model" else "optimizer/state"
        return self.owner.checked(shard, f"{prefix}/{key}", value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.owner.index if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _StagePart(Mapping[str, Any]):
    """One top-level entry of each stage's shard (``probe``), by stage: read and checked when asked for."""

    def __init__(self, owner: ShardedCheckpoint, part: str, files: dict[str, str]) -> None:
        self.owner = owner
        self.part = part
        self.files = files

    def __getitem__(self, stage: str) -> Any:
        shard = self.files[stage]
        value = self.owner.shard(shard).get(self.part)
        if value is None:
            raise KeyError(stage)
        return self.owner.checked(shard, self.part, value)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def _attach_shards(path: Path, state: dict[str, Any], *, allow_nonfinite: bool) -> None:
    """Check the shards ``state`` names and put lazy views of them in its ``model`` and optimizer ``state``."""
    table = state.get("shards")
    if not isinstance(table, dict):
        raise CorruptCheckpoint(f"{path}: 'shards' must be a table of files and an index")
    files, index = table.get("files", []), table.get("index", {})
    bad = [f for f in files if not isinstance(f, str) or not _inside(path.parent, f)]
    if bad or not isinstance(index, dict) or not set(index.values()) <= set(files):
        raise CorruptCheckpoint(f"{path}: its shard table names files outside the directory or unknown shards")
    manifests = {f: _read_manifest(path.parent / f) for f in files}
    recorded = table.get("sha256")  # absent in checkpoints written before the main file recorded them
    if recorded is not None:
        if not isinstance(recorded, dict):
            raise CorruptCheckpoint(f"{path}: its shard table's 'sha256' must map shard files to digests")
        for f in files:
            actual = manifests[f].get("sha256")
            if recorded.get(f) != actual:
                raise CorruptCheckpoint(
                    f"{path}: shard {f} is not the one saved with it (SHA-256 {str(actual)[:12]}... differs from the "
                    f"main file's record {str(recorded.get(f))[:12]}...): a shard swapped with its manifest"
                )
    shards = ShardedCheckpoint(path.parent, index, manifests, allow_nonfinite=allow_nonfinite)
    state["model"] = shards.model
    state.setdefault("optimizer", {})["state"] = shards.optimizer_state
    probe = state.get("probe")  # {stage: shard file}: the probe outputs each stage keeps (a probe-driven policy)
    if probe is not None:
        if not isinstance(probe, dict) or not all(isinstance(f, str) and f in files for f in probe.values()):
            raise CorruptCheckpoint(f"{path}: its probe table names unknown shards")
        state["probe"] = _StagePart(shards, "probe", probe)


def load_verified(path: Path, *, allow_nonfinite: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load one checkpoint file after checking it against its manifest.

    A sharded checkpoint's shards are checked too (each against its manifest's SHA-256), and its ``model`` and
    optimizer ``state`` become lazy views of them (:class:`ShardedCheckpoint`).

    Returns:
        The state and the manifest.

    Raises:
        CorruptCheckpoint: naming the file and what is wrong with it.
    """
    manifest = _read_manifest(path)
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling or zip error means the same: this file cannot be used
        raise CorruptCheckpoint(f"{path}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
    problems = verify_tensors(state, manifest.get("tensors", {}))
    if not allow_nonfinite:
        problems += value_problems(state)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CorruptCheckpoint(f"{path}: {'; '.join(problems[:3])}{more}")
    if "shards" in state:
        _attach_shards(path, state, allow_nonfinite=allow_nonfinite)
    return state, manifest


def verify_shards(state: dict[str, Any], rank: int = 0, world_size: int = 1) -> None:
    """Check every tensor of the shards of a loaded sharded checkpoint that are this rank's share (shard ``i`` for
    ``i % world_size == rank``; the default: all), as :meth:`ShardedCheckpoint.verify` does; nothing for a whole
    (unsharded) checkpoint, whose tensors :func:`load_verified` checked already.

    Raises:
        CorruptCheckpoint: a shard of the share fails a check.
    """
    model = state.get("model")
    if isinstance(model, _ShardView):
        for name in state["shards"]["files"][rank::world_size]:
            model.owner.verify(name)


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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
    last = _order(latest.name)
    older = [p for p in reversed(files) if p != latest and (last is None or _key(p) < last)]
    return [latest, *older]


def find_latest(
    directory: Path, *, allow_nonfinite: bool = False, warn: bool = True
) -> tuple[dict[str, Any], dict[str, Any], Path] | None:
    """The newest intact checkpoint in ``directory``: its state, its manifest and the file actually loaded.

    The file ``latest.json`` names comes first; when it fails a check, the older checkpoints are tried newest
    first, each failure logged (``warn``) with the file's name and the reason. A missing or unusable
    ``latest.json`` falls back to every checkpoint file of the directory, newest first (see :func:`candidates`).
    Every check runs here, the shards' tensors included (:func:`verify_shards`).

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
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """:func:`find_latest` without the path: the newest intact checkpoint's state and manifest, or ``None``."""
    found = find_latest(directory, allow_nonfinite=allow_nonfinite, warn=warn)
    return None if found is None else found[:2]


def candidate_manifests(directory: str | Path) -> list[dict[str, Any]]:
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
    found = []
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


def latest_meta(directory: str | Path) -> dict[str, Any] | None:
    """The first of :func:`candidate_manifests` (``None`` when there is no checkpoint)."""
    manifests = candidate_manifests(directory)
    return manifests[0] if manifests else None
