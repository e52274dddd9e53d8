"""``TrainConfig``: everything one elastic training run needs, frozen and validated, loadable from TOML.

The TOML file has one table per concern; every key is optional except ``[model] name``::

    [model]
    name = "vit"                    # a builder of elastic_pipe.models: "vit", "bert", "gpt"
    options = { preset = "digits-tiny" }

    [data]
    dataset = "digits"              # "digits", "mnist5k", or "synthetic-images" / "synthetic-tokens"

    [train]
    epochs = 6
    global_batch = 64               # samples per optimizer step, whatever the number of replicas
    lr = 0.05

    [freeze]
    policy = "alpha"                # a name of elastic_pipe.freeze.POLICIES
    options = { alpha = 0.5 }

    [pipeline]
    pipe_len = 4                    # initial pipeline length K
    compression = "halving"         # "halving", "memory" or "none" (freeze only, no reshaping)

    [launch]
    nproc_per_node = 4

Structural checks (positive counts, divisibility, known enum values) happen here, without importing torch.
Checks that need the primitives' registries or the model (unknown policy or solver, a pipeline longer than the
model) live in :func:`elastic_pipe.orchestrator.preflight.preflight`; both run before any process group exists.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_pipe.orchestrator.errors import ConfigError

__all__ = [
    "AUTOCAST",
    "BACKENDS",
    "CACHE_MODES",
    "COMPRESSIONS",
    "COST_METRICS",
    "DEFAULT_ALPHA",
    "DTYPES",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "SECTIONS",
    "TrainConfig",
    "load_config",
]

OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("constant", "cosine")
DTYPES = ("float32", "float64")
AUTOCAST = ("none", "bf16")
COMPRESSIONS = ("halving", "memory", "none")
COST_METRICS = ("params", "time")
CACHE_MODES = ("auto", "on", "off")
BACKENDS = ("auto", "gloo", "nccl")
#: The alpha policy's default: 1/3, the published trade-off (2.83x at 90.78% on CIFAR-100).
DEFAULT_ALPHA = 1 / 3


@dataclass(frozen=True)
class TrainConfig:
    """One elastic training run.

    Attributes:
        model: builder name in :data:`elastic_pipe.orchestrator.models.MODEL_BUILDERS` ("vit", "bert", "gpt").
        model_options: keyword arguments for the builder.
        dataset: "digits", "mnist5k", "synthetic-images" or "synthetic-tokens".
        eval_fraction: share of the dataset held out for evaluation (split with ``seed``).
        epochs: number of epochs.
        global_batch: samples per optimizer step over all replicas; each replica gets ``global_batch / replicas``,
            so the batch and the learning-rate schedule do not change when the replica count does.
        lr: peak learning rate.
        optimizer: "sgd" (with ``momentum``) or "adamw".
        momentum: SGD momentum.
        weight_decay: decoupled (AdamW) or L2 (SGD) weight decay.
        lr_schedule: "constant" or "cosine" (over all steps of the run, after ``warmup_steps`` of linear warm-up).
        warmup_steps: linear warm-up steps.
        seed: seeds the model initialisation, the data split and the sampler.
        dtype: parameter dtype, "float32" or "float64" (the equivalence tests use float64).
        autocast: "none" or "bf16" (autocast on the device for the forward passes).
        policy: freeze policy name in :data:`elastic_pipe.freeze.POLICIES`.
        policy_options: keyword arguments for the policy (e.g. ``alpha``; the alpha policy defaults to 1/3).
        pipe_len: initial pipeline length K; must divide the world size.
        solver: partition solver name in :data:`elastic_pipe.partition.SOLVERS`.
        cost: per-sub-layer cost the partition balances: "params" (the published proxy) or "time" (profiled).
        compression: "halving" (the published rule), "memory", or "none" (freeze only; length and replicas fixed).
        schedule: pipeline schedule kind in :data:`elastic_pipe.schedule.GENERATORS`.
        microbatches: micro-batches per step and replica while the pipeline has more than one stage.
        microbatches_by_pipe_len: micro-batches for particular pipeline lengths, e.g. ``{2: 4, 1: 1}``
            (the published system profiled one M per K). A length not listed uses ``microbatches``, except
            length 1, which uses 1: a one-stage pipeline has no bubble to fill, so more micro-batches only add
            host overhead per step (list ``1`` here to accumulate gradients over several micro-batches anyway).
        cache: frozen-prefix activation cache: "auto" (when it pays), "on" or "off".
        cache_mb: device-tier budget of the activation cache per stage-0 rank, in MiB.
        nproc_per_node: processes (devices) per node.
        nnodes: number of nodes.
        backend: training-group backend: "auto" (NCCL when CUDA is available, else gloo), "gloo" or "nccl".
        timeout: seconds every collective may take before the job fails instead of hanging.
        max_restarts: restarts torchrun allows after a failure (the job resumes from the last checkpoint).
        rdzv_endpoint: ``host:port`` of the c10d rendezvous ("" means a local standalone run).
        checkpoint_dir: directory for checkpoints ("" disables checkpoints).
        checkpoint_every: save a checkpoint every this many epochs.
        checkpoint_steps: also save one every this many steps inside an epoch (0: only at epoch ends).
        resume: "auto" (resume from ``checkpoint_dir`` when it holds a checkpoint) or "never".
        log_dir: directory for ``events.jsonl`` and ``metrics.jsonl`` ("" disables the files).
        progress: draw a progress bar per epoch on stderr.
        timing_interval: on a GPU, every this many steps (the ``interval``-th, ``2 * interval``-th, ...; the last
            one when an epoch is shorter; never an epoch's first, which carries a new layout's warm-up) one
            synchronises the device at each phase edge to split its time into phases (data, forward, backward,
            gradient sync, optimizer); the other steps run without a host-device synchronisation, so that the
            host queues work ahead of the GPU. 1 times every step (exact breakdowns, slower steps). On a CPU
            every step is timed (there is nothing to synchronise).

    Raises:
        ConfigError: on any value that cannot work, naming it and what was expected.
    """

    model: str
    model_options: Mapping[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    eval_fraction: float = 0.2
    epochs: int = 6
    global_batch: int = 64
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    seed: int = 0
    dtype: str = "float32"
    autocast: str = "none"
    policy: str = "alpha"
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    pipe_len: int = 1
    solver: str = "greedy"
    cost: str = "params"
    compression: str = "halving"
    schedule: str = "gpipe"
    microbatches: int = 4
    microbatches_by_pipe_len: Mapping[int, int] = field(default_factory=dict)
    cache: str = "auto"
    cache_mb: int = 256
    nproc_per_node: int = 1
    nnodes: int = 1
    backend: str = "auto"
    timeout: float = 120.0
    max_restarts: int = 0
    rdzv_endpoint: str = ""
    checkpoint_dir: str = ""
    checkpoint_every: int = 1
    checkpoint_steps: int = 0
    resume: str = "auto"
    log_dir: str = ""
    progress: bool = True
    timing_interval: int = 10

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must name a model builder (e.g. 'vit'), got an empty string")
        for name in (
            "epochs",
            "global_batch",
            "pipe_len",
            "microbatches",
            "cache_mb",
            "nproc_per_node",
            "nnodes",
            "checkpoint_every",
            "timing_interval",
        ):
            _positive_int(name, getattr(self, name))
        for name in ("warmup_steps", "seed", "max_restarts", "checkpoint_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
        for name, allowed in (
            ("optimizer", OPTIMIZERS),
            ("lr_schedule", LR_SCHEDULES),
            ("dtype", DTYPES),
            ("autocast", AUTOCAST),
            ("compression", COMPRESSIONS),
            ("cost", COST_METRICS),
            ("cache", CACHE_MODES),
            ("backend", BACKENDS),
            ("resume", ("auto", "never")),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        for name in ("lr", "timeout"):
            _positive_float(name, getattr(self, name))
        for name in ("momentum", "weight_decay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in (0, 1), got {self.eval_fraction!r}")
        if self.world_size % self.pipe_len:
            raise ConfigError(
                f"world size {self.world_size} (nproc_per_node={self.nproc_per_node} x nnodes={self.nnodes}) "
                f"is not divisible by pipe_len={self.pipe_len}"
            )
        if self.pipe_len > self.nproc_per_node:
            raise ConfigError(
                f"pipe_len={self.pipe_len} exceeds nproc_per_node={self.nproc_per_node}: "
                "a pipeline stays inside one node"
            )
        # The batch of every replica must split into equal micro-batches for every replica count the job can reach
        # (up to one replica per process); equal micro-batches keep the gradient an exact mean over the batch.
        unit = self.world_size * self.microbatches
        if self.global_batch % unit:
            raise ConfigError(
                f"global_batch={self.global_batch} must be divisible by world size x microbatches = "
                f"{self.world_size} x {self.microbatches} = {unit}, so every replica count gets equal micro-batches"
            )
        table: dict[int, int] = {}
        for key, value in dict(self.microbatches_by_pipe_len).items():
            try:
                length = int(key)  # TOML and JSON keys are strings
            except (TypeError, ValueError):
                raise ConfigError(f"microbatches_by_pipe_len keys must be pipeline lengths, got {key!r}") from None
            _positive_int(f"microbatches_by_pipe_len[{length}]", value)
            if length < 1 or self.world_size % length:
                raise ConfigError(
                    f"microbatches_by_pipe_len lists pipe_len={length}, which does not divide the world size "
                    f"{self.world_size}"
                )
            replica_batch = self.global_batch // (self.world_size // length)
            if replica_batch % value:
                raise ConfigError(
                    f"microbatches_by_pipe_len[{length}]={value} does not divide the per-replica batch "
                    f"{replica_batch} (global_batch={self.global_batch} over {self.world_size // length} replicas)"
                )
            table[length] = value
        object.__setattr__(self, "microbatches_by_pipe_len", table)
        object.__setattr__(self, "model_options", dict(self.model_options))
        options = dict(self.policy_options)
        if self.policy == "alpha" and not options:
            options = {"alpha": DEFAULT_ALPHA}
        object.__setattr__(self, "policy_options", options)

    @property
    def world_size(self) -> int:
        """Number of processes: ``nproc_per_node * nnodes``."""
        return self.nproc_per_node * self.nnodes

    @property
    def initial_replicas(self) -> int:
        """Data-parallel replicas at the start: world size / initial pipeline length."""
        return self.world_size // self.pipe_len

    def microbatches_for(self, pipe_len: int) -> int:
        """Micro-batches per step and replica for a pipeline of ``pipe_len`` stages (see the attribute docs)."""
        if pipe_len in self.microbatches_by_pipe_len:
            return self.microbatches_by_pipe_len[pipe_len]
        return self.microbatches if pipe_len > 1 else 1

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON- and TOML-friendly), the inverse of ``TrainConfig(**d)``."""
        d = dataclasses.asdict(self)
        d["model_options"] = dict(self.model_options)
        d["policy_options"] = dict(self.policy_options)
        d["microbatches_by_pipe_len"] = dict(self.microbatches_by_pipe_len)
        return d


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


#: TOML table -> {key in the table -> TrainConfig field}.
SECTIONS: dict[str, dict[str, str]] = {
    "model": {"name": "model", "options": "model_options"},
    "data": {"dataset": "dataset", "eval_fraction": "eval_fraction"},
    "train": {
        "epochs": "epochs",
        "global_batch": "global_batch",
        "lr": "lr",
        "optimizer": "optimizer",
        "momentum": "momentum",
        "weight_decay": "weight_decay",
        "lr_schedule": "lr_schedule",
        "warmup_steps": "warmup_steps",
        "seed": "seed",
        "dtype": "dtype",
        "autocast": "autocast",
    },
    "freeze": {"policy": "policy", "options": "policy_options"},
    "pipeline": {
        "pipe_len": "pipe_len",
        "solver": "solver",
        "cost": "cost",
        "compression": "compression",
        "schedule": "schedule",
        "microbatches": "microbatches",
        "microbatches_by_pipe_len": "microbatches_by_pipe_len",
        "cache": "cache",
        "cache_mb": "cache_mb",
    },
    "launch": {
        "nproc_per_node": "nproc_per_node",
        "nnodes": "nnodes",
        "backend": "backend",
        "timeout": "timeout",
        "max_restarts": "max_restarts",
        "rdzv_endpoint": "rdzv_endpoint",
    },
    "checkpoint": {
        "dir": "checkpoint_dir",
        "every": "checkpoint_every",
        "steps": "checkpoint_steps",
        "resume": "resume",
    },
    "log": {"dir": "log_dir", "progress": "progress", "timing_interval": "timing_interval"},
}


def config_from_tables(tables: Mapping[str, Any], *, source: str = "config") -> TrainConfig:
    """Build a :class:`TrainConfig` from TOML-shaped tables (``{"model": {...}, "train": {...}}``).

    Raises:
        ConfigError: on an unknown table or key (listing the valid ones) or a bad value.
    """
    fields: dict[str, Any] = {}
    for section, body in tables.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown table [{section}]; expected one of {', '.join(SECTIONS)}")
        if not isinstance(body, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table, got {body!r}")
        keys = SECTIONS[section]
        for key, value in body.items():
            if key not in keys:
                raise ConfigError(f"{source}: unknown key {key!r} in [{section}]; expected one of {', '.join(keys)}")
            fields[keys[key]] = value
    if "model" not in fields:
        raise ConfigError(f"{source}: [model] name is required (e.g. name = 'vit')")
    try:
        return TrainConfig(**fields)
    except TypeError as exc:  # a wrong type where a table was expected, e.g. options = 3
        raise ConfigError(f"{source}: {exc}") from exc


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
