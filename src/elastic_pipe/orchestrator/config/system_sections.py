"""The sections of where and how a run executes: ``[pipeline]`` (with its cache tiers), ``[launch]``,
``[checkpoint]``, ``[log]``; each a frozen, validated dataclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict, cast

from elastic_pipe.orchestrator.config.values import (
    BACKENDS,
    CACHE_DTYPES,
    CACHE_MODES,
    CACHE_POLICIES,
    CACHE_TIER_KEYS,
    COMPRESSIONS,
    COST_METRICS,
    HOST_KINDS,
    MAX_TIMEOUT_S,
    VIRTUAL_AUTO,
    as_table,
    check_at_most,
    check_nonnegative_int,
    check_one_of,
    check_positive_float,
    check_positive_int,
    check_string,
    size_bytes,
)
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["CacheTierTable", "CheckpointSection", "LaunchSection", "LogSection", "PipelineSection"]


class CacheTierTable(TypedDict, total=False):
    """``[pipeline] cache_tiers`` once checked: sizes in bytes, the rest strings (see :class:`PipelineSection`)."""

    device: int
    host: int
    disk: str
    disk_size: int
    host_kind: str
    host_dir: str


def _cache_tiers(value: object) -> CacheTierTable:
    """``[pipeline] cache_tiers`` checked, sizes as byte counts (so the table round-trips through ``to_dict``)."""
    table = as_table("pipeline.cache_tiers", value)
    unknown = sorted(set(table) - set(CACHE_TIER_KEYS))
    if unknown:
        raise ConfigError(
            f"pipeline.cache_tiers: unknown key {unknown[0]!r}; expected one of {', '.join(CACHE_TIER_KEYS)}"
        )
    out: dict[str, int | str] = {}
    for key, raw in table.items():
        if key in ("device", "host", "disk_size"):
            out[key] = size_bytes(raw, f"pipeline.cache_tiers.{key}")
        else:
            check_string(f"pipeline.cache_tiers.{key}", raw)
            out[key] = str(raw)
    if "host_kind" in out:
        check_one_of("pipeline.cache_tiers.host_kind", out["host_kind"], HOST_KINDS)
    if out.get("disk_size") and not out.get("disk"):
        raise ConfigError(f"pipeline.cache_tiers.disk_size = {out['disk_size']} needs a disk directory (disk = ...)")
    if out.get("host_dir") and out.get("host_kind") == "pinned":
        raise ConfigError("pipeline.cache_tiers.host_dir is for host_kind = 'shared'; a pinned host tier has no files")
    return cast("CacheTierTable", out)  # its keys are CACHE_TIER_KEYS (checked), sizes ints, the rest strings


@dataclass(frozen=True)
class PipelineSection:
    """``[pipeline]``: the initial layout and how it changes.

    Attributes:
        pipe_len: initial pipeline length K; must divide the world size.
        solver: partition solver name in :data:`elastic_pipe.partition.SOLVERS`, or ``"module:attr"``.
        cost: per-sub-layer cost the partition balances: "params" (the published proxy) or "time" (profiled).
        compression: "halving" (the published rule), "memory", "none" (freeze only; length and replicas fixed), or
            ``"module:attr"`` of a :class:`~elastic_pipe.orchestrator.layout.compression.CompressionRule` object.
        schedule: pipeline schedule kind in :data:`elastic_pipe.schedule.GENERATORS`.
        virtual: stages per rank v (``pipe_len * virtual`` stages, stage ``s`` on rank ``s % pipe_len``): 1 for
            ``gpipe``, ``1f1b`` and ``zb1p``, 2 or more for ``interleaved`` (micro-batches a multiple of pipe_len);
            or ``"auto"``: the layout rule chooses v for every layout it makes, among those the schedule runs, by
            the simulated step (:func:`~elastic_pipe.orchestrator.layout.virtual_choice.choose_virtual`).
        microbatches: micro-batches per step and replica while the pipeline has more than one stage.
        microbatches_by_pipe_len: micro-batches for particular pipeline lengths, e.g. ``{2: 4, 1: 1}``
            (the published system profiled one M per K). A length not listed uses ``microbatches``, except
            length 1, which uses 1: a one-stage pipeline has no bubble to fill, so more micro-batches only add
            host overhead per step (list ``1`` here to accumulate gradients over several micro-batches anyway).
        cache: frozen-prefix activation cache: "auto" (when it pays, judged at the read speed of the tiers the
            entries land in), "on" or "off".
        cache_mb: device-tier budget of the activation cache per stage-0 rank, in MiB (``cache_tiers.device``
            replaces it when given).
        cache_tiers: the cache's tiers, e.g. ``{ device = "20GiB", host = "200GiB", disk = "/nvme/ep-cache" }``:
            ``device`` (bytes of device memory per stage-0 rank), ``host`` (host memory per node: ``/dev/shm``
            files shared by the node's ranks, or with ``host_kind = "pinned"`` page-locked memory per rank),
            ``disk`` (a directory; checksummed files per node) with ``disk_size`` (its budget; default: as much
            as the cache needs, a full file system then leaves the rest uncached), ``host_dir`` (instead of
            ``/dev/shm``). Sizes are byte counts or strings like ``"512MiB"`` (:func:`elastic_pipe.types.parse_bytes`).
        cache_policy: what the cache does for a dataset that declares random transforms (``random_augmentation =
            True``): "bypass" (the default: the frozen prefix is recomputed every step, nothing is cached) or
            "views" (``views`` augmented views per sample are cached, epoch ``e`` reads view ``e % views``).
            A dataset without random transforms is cached exactly, whatever this says.
        views: augmented views cached per sample under ``cache_policy = "views"``.
        cache_dtype: the dtype the cache stores its entries in: "auto" (the default: the frozen prefix output's
            own, exact) or "bfloat16", "float16", "float32", used only where it is narrower than a floating prefix
            output (half the bytes of float32 entries, each rounded: a relative error up to ``2**-8`` in
            bfloat16); an output it would widen, or an integer one, is kept as it is. Reads are cast back to the
            output's dtype on the device, and a step's recomputed misses are rounded the same way.
        memory_budget: the most bytes of training state one rank may hold ("40GiB", "16G", "512MiB", "2.5GB", a byte
            count; "" for no limit): an active sub-layer costs its weights, gradients and optimizer state, a frozen
            one (on stage 0) its weights. The initial pipeline is the shortest that fits, compression never picks
            one that does not, and a job none fits is refused before any process group forms.
    """

    pipe_len: int = 1
    solver: str = "greedy"
    cost: str = "params"
    compression: str = "halving"
    schedule: str = "gpipe"
    virtual: int | str = 1
    microbatches: int = 4
    microbatches_by_pipe_len: Mapping[int, int] = field(default_factory=dict)
    cache: str = "auto"
    cache_mb: int = 256
    cache_tiers: CacheTierTable = field(default_factory=CacheTierTable)
    cache_policy: str = "bypass"
    views: int = 1
    cache_dtype: str = "auto"
    memory_budget: str | int = ""

    @property
    def memory_budget_bytes(self) -> int | None:
        """:attr:`memory_budget` in bytes, or ``None`` for no limit."""
        return size_bytes(self.memory_budget, "pipeline.memory_budget") if self.memory_budget != "" else None

    def __post_init__(self) -> None:
        if self.memory_budget != "" and size_bytes(self.memory_budget, "pipeline.memory_budget") < 1:
            raise ConfigError(f"pipeline.memory_budget must be at least one byte, got {self.memory_budget!r}")
        for name in ("pipe_len", "microbatches", "cache_mb", "views"):
            check_positive_int(f"pipeline.{name}", getattr(self, name))
        v = self.virtual
        if v != VIRTUAL_AUTO and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"pipeline.virtual must be an integer >= 1 or {VIRTUAL_AUTO!r}, got {v!r}")
        for name in ("solver", "schedule"):
            check_string(f"pipeline.{name}", getattr(self, name))
        check_one_of("pipeline.cost", self.cost, COST_METRICS)
        if ":" not in self.compression:
            check_one_of("pipeline.compression", self.compression, COMPRESSIONS)
        check_one_of("pipeline.cache", self.cache, CACHE_MODES)
        check_one_of("pipeline.cache_policy", self.cache_policy, CACHE_POLICIES)
        check_one_of("pipeline.cache_dtype", self.cache_dtype, CACHE_DTYPES)
        if self.views > 1 and self.cache_policy != "views":
            raise ConfigError(f"pipeline.views = {self.views} needs cache_policy = 'views', got {self.cache_policy!r}")
        object.__setattr__(self, "cache_tiers", _cache_tiers(self.cache_tiers))
        table: dict[int, int] = {}
        for key, value in as_table("pipeline.microbatches_by_pipe_len", self.microbatches_by_pipe_len).items():
            try:
                length = int(key)  # TOML and JSON keys are strings
            except (TypeError, ValueError):
                raise ConfigError(f"microbatches_by_pipe_len keys must be pipeline lengths, got {key!r}") from None
            table[length] = check_positive_int(f"microbatches_by_pipe_len[{length}]", value)
        object.__setattr__(self, "microbatches_by_pipe_len", table)


@dataclass(frozen=True)
class LaunchSection:
    """``[launch]``: the processes.

    Attributes:
        nproc_per_node: processes (devices) per node.
        nnodes: number of nodes.
        backend: training-group backend: "auto" (NCCL when every local rank has a CUDA device of its own, else
            gloo), "gloo" or "nccl".
        timeout: seconds every collective may take before the job fails instead of hanging (at most
            :data:`MAX_TIMEOUT_S`).
        max_restarts: restarts torchrun allows after a failure (the job resumes from the last checkpoint).
        rdzv_endpoint: ``host:port`` of the c10d rendezvous ("" means a local standalone run).
        run_id: the job's id, shared by every node's agent ("" gives a single-node job a fresh random one; several
            nodes must set it). Not a secret: the rendezvous is authenticated by a separate secret
            (:mod:`~elastic_pipe.orchestrator.launch.rendezvous`).
    """

    nproc_per_node: int = 1
    nnodes: int = 1
    backend: str = "auto"
    timeout: float = 120.0
    max_restarts: int = 0
    rdzv_endpoint: str = ""
    run_id: str = ""

    def __post_init__(self) -> None:
        check_positive_int("launch.nproc_per_node", self.nproc_per_node)
        check_positive_int("launch.nnodes", self.nnodes)
        check_nonnegative_int("launch.max_restarts", self.max_restarts)
        check_one_of("launch.backend", self.backend, BACKENDS)
        check_positive_float("launch.timeout", self.timeout)
        check_at_most("launch.timeout", self.timeout, MAX_TIMEOUT_S, "MAX_TIMEOUT_S", "one day, in seconds")
        check_string("launch.rdzv_endpoint", self.rdzv_endpoint)
        check_string("launch.run_id", self.run_id)


@dataclass(frozen=True)
class CheckpointSection:
    """``[checkpoint]``: saving and resuming.

    Attributes:
        dir: directory for checkpoints ("" disables checkpoints).
        every: save a checkpoint every this many epochs.
        steps: also save one every this many steps inside an epoch (0: only at epoch ends).
        resume: "auto" (resume from ``dir`` when it holds a checkpoint) or "never".
        keep_last: keep only this many newest checkpoints, deleting older ones after each save (0 keeps all).
        allow_nonfinite: load a checkpoint whose floating-point tensors hold NaN, infinity or magnitudes above
            :data:`~elastic_pipe.orchestrator.persist.integrity.MAX_ABS` (refused as corrupt by default).
        allow_config_change: resume although the config differs from the checkpoint's in more than a resume may
            change (:mod:`~elastic_pipe.orchestrator.persist.rerun`); the ``resume`` record lists the changes.
    """

    dir: str = ""
    every: int = 1
    steps: int = 0
    resume: str = "auto"
    keep_last: int = 0
    allow_nonfinite: bool = False
    allow_config_change: bool = False

    def __post_init__(self) -> None:
        check_string("checkpoint.dir", self.dir)
        check_positive_int("checkpoint.every", self.every)
        check_nonnegative_int("checkpoint.steps", self.steps)
        check_one_of("checkpoint.resume", self.resume, ("auto", "never"))
        check_nonnegative_int("checkpoint.keep_last", self.keep_last)
        if not isinstance(self.allow_nonfinite, bool):
            raise ConfigError(f"checkpoint.allow_nonfinite must be true or false, got {self.allow_nonfinite!r}")
        if not isinstance(self.allow_config_change, bool):
            raise ConfigError(f"checkpoint.allow_config_change must be true or false, got {self.allow_config_change!r}")


@dataclass(frozen=True)
class LogSection:
    """``[log]``: what the run reports.

    Attributes:
        dir: directory for ``events.jsonl`` ("" disables the file).
        progress: show progress per epoch on stderr: a bar with steps/s and ETA on a terminal, a plain line
            every 10% of the epoch (or 30 s) otherwise.
        eval_every: evaluate on the held-out split every this many epochs (and always after the last one).
        timing_interval: on a GPU, every this many steps (the ``interval``-th, ``2 * interval``-th, ...; the last
            one when an epoch is shorter; never an epoch's first, which carries a new layout's warm-up) one
            synchronises the device at each phase edge to split its time into phases (data, forward, backward,
            gradient sync, optimizer); the other steps run without a host-device synchronisation, so that the
            host queues work ahead of the GPU. 1 times every step (exact breakdowns, slower steps). On a CPU
            every step is timed (there is nothing to synchronise).
        tensorboard: rank 0 also writes each epoch's and transition's scalars with TensorBoard's
            ``SummaryWriter`` into ``<dir>/tensorboard`` (needs ``dir`` and the ``tensorboard`` extra).
    """

    dir: str = ""
    progress: bool = True
    timing_interval: int = 10
    eval_every: int = 1
    tensorboard: bool = False

    def __post_init__(self) -> None:
        check_string("log.dir", self.dir)
        check_positive_int("log.eval_every", self.eval_every)
        if not isinstance(self.progress, bool):
            raise ConfigError(f"log.progress must be true or false, got {self.progress!r}")
        check_positive_int("log.timing_interval", self.timing_interval)
        if not isinstance(self.tensorboard, bool):
            raise ConfigError(f"log.tensorboard must be true or false, got {self.tensorboard!r}")
        if self.tensorboard and not self.dir:
            raise ConfigError("log.tensorboard = true needs log.dir: the scalars go to <dir>/tensorboard")
