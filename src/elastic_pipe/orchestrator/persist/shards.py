"""A sharded checkpoint's shards, read tensor by tensor and checked as they are read.

:func:`attach_shards` checks every shard's SHA-256 against its manifest and against the main file's record (a
shard swapped together with its manifest is refused) before anything is used, and puts lazy views of the shards
(:class:`ShardedCheckpoint`: the files are memory-mapped; a tensor is read only when asked for, its CRC-32 and its
values checked then) in the main file's state. Before a resume decides on a checkpoint, :func:`verify_shards` reads
every tensor of a share of the shards (each rank its own share) and checks them all, so no check fails after the
decision.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from elastic_pipe.orchestrator.persist.files import CorruptCheckpoint, JsonObject, SavedState, is_inside, read_manifest
from elastic_pipe.orchestrator.persist.integrity import tensor_checksums, value_problems, verify_tensors

__all__ = ["ShardedCheckpoint", "attach_shards", "verify_shards"]

_T = TypeVar("_T")


class ShardedCheckpoint:
    """The shards of one checkpoint, read tensor by tensor (memory-mapped; nothing is read until asked for).

    ``model`` and ``optimizer_state`` are mappings by model key and parameter name, the shape the ``model`` and
    ``optimizer`` parts read (:mod:`elastic_pipe.orchestrator.persist.snapshot`); every tensor handed out has passed
    its CRC-32 and (unless ``allow_nonfinite``) the value checks.

    Args:
        directory: where the shards are.
        index: ``{model key: shard file name}``.
        manifests: each shard's manifest, by file name (already checked against the file's SHA-256).
        allow_nonfinite: accept NaN, infinite and huge values.
    """

    def __init__(
        self, directory: Path, index: dict[str, str], manifests: dict[str, JsonObject], *, allow_nonfinite: bool
    ) -> None:
        self.directory = directory
        self.index = index
        self.manifests = manifests
        self.allow_nonfinite = allow_nonfinite
        self._open: dict[str, SavedState] = {}
        self.model = _ShardView(self, "model")
        self.optimizer_state = _ShardView(self, "optimizer")

    def shard(self, name: str) -> SavedState:
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

    def checked(self, shard: str, path: str, value: _T) -> _T:
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


class _ShardView(Mapping[str, object]):
    """One part of a sharded checkpoint (``model`` tensors or ``optimizer`` states) as a mapping."""

    def __init__(self, owner: ShardedCheckpoint, part: str) -> None:
        self.owner = owner
        self.part = part

    def _find(self, key: str) -> tuple[str, object] | None:
        shard = self.owner.index.get(key)
        if shard is None:
            return None
        table = self.owner.shard(shard).get("model" if self.part == "model" else "optimizer", {})
        if self.part != "model":
            table = table.get("state", {})
        return (shard, table[key]) if key in table else None

    def __getitem__(self, key: str) -> object:
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


class _StagePart(Mapping[str, object]):
    """One top-level entry of each stage's shard (``probe``), by stage: read and checked when asked for."""

    def __init__(self, owner: ShardedCheckpoint, part: str, files: dict[str, str]) -> None:
        self.owner = owner
        self.part = part
        self.files = files

    def __getitem__(self, stage: str) -> object:
        shard = self.files[stage]
        value = self.owner.shard(shard).get(self.part)
        if value is None:
            raise KeyError(stage)
        return self.owner.checked(shard, self.part, value)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def attach_shards(path: Path, state: SavedState, *, allow_nonfinite: bool) -> None:
    """Check the shards ``state`` names and put lazy views of them in its ``model`` and optimizer ``state``."""
    table = state.get("shards")
    if not isinstance(table, dict):
        raise CorruptCheckpoint(f"{path}: 'shards' must be a table of files and an index")
    files, index = table.get("files", []), table.get("index", {})
    bad = [f for f in files if not isinstance(f, str) or not is_inside(path.parent, f)]
    if bad or not isinstance(index, dict) or not set(index.values()) <= set(files):
        raise CorruptCheckpoint(f"{path}: its shard table names files outside the directory or unknown shards")
    manifests = {f: read_manifest(path.parent / f) for f in files}
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


def verify_shards(state: Mapping[str, object], rank: int = 0, world_size: int = 1) -> None:
    """Check every tensor of the shards of a loaded sharded checkpoint that are this rank's share (shard ``i`` for
    ``i % world_size == rank``; the default: all), as :meth:`ShardedCheckpoint.verify` does; nothing for a whole
    (unsharded) checkpoint, whose tensors :func:`~.loads.load_verified` checked already.

    Raises:
        CorruptCheckpoint: a shard of the share fails a check.
    """
    model, table = state.get("model"), state.get("shards")
    if isinstance(model, _ShardView) and isinstance(table, dict):  # attach_shards checked the table
        for name in table["files"][rank::world_size]:
            model.owner.verify(name)
