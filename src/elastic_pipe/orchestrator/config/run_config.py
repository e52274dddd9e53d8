"""``TrainConfig``: one run's sections, checked together; read from TOML tables or a file, overridden by
``"section.key"`` (the face, :mod:`elastic_pipe.orchestrator.config`, shows a whole file).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_pipe.orchestrator.config.sections import DataSection, FreezeSection, ModelSection, TrainSection
from elastic_pipe.orchestrator.config.system_sections import (
    CheckpointSection,
    LaunchSection,
    LogSection,
    PipelineSection,
)
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["SECTIONS", "TrainConfig", "config_from_tables", "load_config"]

#: TOML table name -> its section class, in the file's order.
SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "data": DataSection,
    "train": TrainSection,
    "freeze": FreezeSection,
    "pipeline": PipelineSection,
    "launch": LaunchSection,
    "checkpoint": CheckpointSection,
    "log": LogSection,
}


@dataclass(frozen=True)
class TrainConfig:
    """One elastic training run: one frozen section per TOML table, checked together.

    Raises:
        ConfigError: on any value that cannot work, naming it and what was expected.
    """

    model: ModelSection
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    freeze: FreezeSection = field(default_factory=FreezeSection)
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    launch: LaunchSection = field(default_factory=LaunchSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"TrainConfig.{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        p, world = self.pipeline, self.world_size
        if world % p.pipe_len:
            raise ConfigError(
                f"world size {world} (nproc_per_node={self.launch.nproc_per_node} x nnodes={self.launch.nnodes}) "
                f"is not divisible by pipe_len={p.pipe_len}"
            )
        if p.pipe_len > self.launch.nproc_per_node:
            raise ConfigError(
                f"pipe_len={p.pipe_len} exceeds nproc_per_node={self.launch.nproc_per_node}: "
                "a pipeline stays inside one node"
            )
        # The batch of every replica must split into equal micro-batches for every replica count the job can reach
        # (up to one replica per process); equal micro-batches keep the gradient an exact mean over the batch.
        unit = world * p.microbatches
        if self.train.global_batch % unit:
            raise ConfigError(
                f"global_batch={self.train.global_batch} must be divisible by world size x microbatches = "
                f"{world} x {p.microbatches} = {unit}, so every replica count gets equal micro-batches"
            )
        for length, value in p.microbatches_by_pipe_len.items():
            if length < 1 or world % length:
                raise ConfigError(
                    f"microbatches_by_pipe_len lists pipe_len={length}, which does not divide the world size {world}"
                )
            replica_batch = self.train.global_batch // (world // length)
            if replica_batch % value:
                raise ConfigError(
                    f"microbatches_by_pipe_len[{length}]={value} does not divide the per-replica batch "
                    f"{replica_batch} (global_batch={self.train.global_batch} over {world // length} replicas)"
                )

    @property
    def world_size(self) -> int:
        """Number of processes: ``nproc_per_node * nnodes``."""
        return self.launch.nproc_per_node * self.launch.nnodes

    @property
    def initial_replicas(self) -> int:
        """Data-parallel replicas at the start: world size / initial pipeline length."""
        return self.world_size // self.pipeline.pipe_len

    def microbatches_for(self, pipe_len: int) -> int:
        """Micro-batches per step and replica for a pipeline of ``pipe_len`` stages (see :class:`PipelineSection`)."""
        table = self.pipeline.microbatches_by_pipe_len
        if pipe_len in table:
            return table[pipe_len]
        return self.pipeline.microbatches if pipe_len > 1 else 1

    def override(self, changes: Mapping[str, object]) -> TrainConfig:
        """A copy with ``{"section.key": value}`` changes applied, validated again (the CLI's ``--set``).

        Raises:
            ConfigError: an unknown section or key (listing the valid ones), or a value that cannot work.
        """
        tables = self.to_dict()
        for dotted, value in changes.items():
            section, _, key = dotted.partition(".")
            if section not in SECTIONS or not key:
                raise ConfigError(
                    f"override {dotted!r}: expected 'section.key' with a section of {', '.join(SECTIONS)}"
                )
            keys = [f.name for f in dataclasses.fields(SECTIONS[section])]
            if key not in keys:
                raise ConfigError(f"override {dotted!r}: unknown key {key!r} in [{section}]; expected one of {keys}")
            tables[section][key] = value
        return config_from_tables(tables, source="override")

    def to_dict(self) -> dict[str, dict[str, object]]:
        """Plain-data form in the TOML's shape (JSON-friendly), the inverse of :func:`config_from_tables`."""
        out: dict[str, dict[str, object]] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)}
        return out


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


def config_from_tables(tables: Mapping[str, object], *, source: str = "config") -> TrainConfig:
    """Build a :class:`TrainConfig` from TOML-shaped tables (``{"model": {...}, "train": {...}}``).

    Raises:
        ConfigError: on an unknown table or key (listing the valid ones) or a bad value.
    """
    sections: dict[str, Any] = {}
    for name, body in tables.items():
        if name not in SECTIONS:
            raise ConfigError(f"{source}: unknown table [{name}]; expected one of {', '.join(SECTIONS)}")
        if not isinstance(body, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table, got {body!r}")
        cls = SECTIONS[name]
        keys = [f.name for f in dataclasses.fields(cls)]
        for key in body:
            if key not in keys:
                raise ConfigError(f"{source}: unknown key {key!r} in [{name}]; expected one of {', '.join(keys)}")
        try:
            sections[name] = cls(**body)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except TypeError as exc:  # a wrong type where a table was expected, e.g. options = 3
            raise ConfigError(f"{source}: [{name}]: {exc}") from None
    if "model" not in sections:
        raise ConfigError(f"{source}: [model] name is required (e.g. name = 'vit')")
    try:
        return TrainConfig(**sections)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a TOML training configuration.

    Raises:
        ConfigError: if the file cannot be read, is not TOML, or describes an impossible run.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc
    try:
        tables = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from exc
    return config_from_tables(tables, source=str(p))
