"""The sections of a training config, one frozen, validated dataclass per TOML table.

:class:`~elastic_pipe.orchestrator.config.TrainConfig` holds one of each and checks them together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.types import ByteSizeError, parse_bytes

__all__ = [
    "AUTOCAST",
    "BACKENDS",
    "CACHE_MODES",
    "CACHE_POLICIES",
    "CACHE_TIER_KEYS",
    "COMPILE_MODES",
    "COMPRESSIONS",
    "COST_METRICS",
    "CUDA_GRAPH_MODES",
    "DECIDE_AUTO",
    "DEFAULT_ALPHA",
    "DEFAULT_POLICY",
    "DEFAULT_T0",
    "DTYPES",
    "LR_SCHEDULES",
    "MAX_EPOCHS",
    "MAX_TIMEOUT_S",
    "OPTIMIZERS",
    "SECTIONS",
    "SEED_LIMIT",
    "CheckpointSection",
    "DataSection",
    "FreezeSection",
    "LaunchSection",
    "LogSection",
    "ModelSection",
    "PipelineSection",
    "TrainSection",
    "size_bytes",
]

OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("constant", "cosine")
DTYPES = ("float32", "float64")
AUTOCAST = ("none", "bf16")
COMPRESSIONS = ("halving", "memory", "none")
COST_METRICS = ("params", "time")
CACHE_MODES = ("auto", "on", "off")
#: What the activation cache does for a dataset that declares random transforms.
CACHE_POLICIES = ("bypass", "views")
#: ``[pipeline] cache_dtype``: the dtype the activation cache stores entries in ("auto": the prefix output's own).
CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")
#: Keys of ``[pipeline] cache_tiers``.
CACHE_TIER_KEYS = ("device", "host", "disk", "disk_size", "host_kind", "host_dir")
HOST_KINDS = ("shared", "pinned")
BACKENDS = ("auto", "gloo", "nccl")
COMPILE_MODES = ("auto", "on", "off")
CUDA_GRAPH_MODES = ("auto", "on", "off")
#: Seeds stay below 2**31 so that they fit a signed 32-bit integer, which every consumer of a seed accepts (numpy's
#: legacy ``RandomState``, a C ``int``, a torch generator, JSON readers in other languages).
SEED_LIMIT = 2**31
#: Longest collective timeout, one day: a larger one only turns a dead peer into a hang nobody notices.
MAX_TIMEOUT_S = 86_400.0
#: Most epochs a run may ask for: far above any real run, low enough to catch a typo (an extra digit or three).
MAX_EPOCHS = 100_000
#: The alpha policy's default: 1/3, the published trade-off (2.83x at 90.78% on CIFAR-100).
DEFAULT_ALPHA = 1 / 3
#: The default freeze policy: ``drift`` with its own defaults (:mod:`elastic_pipe.freeze.drift`): the lower blocks
#: freeze once they move much less than the top one, everything once the top has settled, not before 60% of the run.
#: The accuracy study measured it within 0.5 points of no freezing on both of its tasks while skipping 52% and 34% of
#: the forward+backward compute (``benchmarks/results/freeze_accuracy.json``, docs/freeze.md, "The default policy").
#: It reads a probe batch while training, so a run under it cannot be planned ahead (plan with a schedule).
DEFAULT_POLICY = "drift"
#: ``[freeze] decide_every`` by default: the policy's own rhythm (:func:`elastic_pipe.orchestrator.components.
#: decision_interval`).
DECIDE_AUTO = "auto"
#: FreezeOut's default ``t0`` (the first unit stops at 70% of the run, the last one trains to the end).
DEFAULT_T0 = 0.7


def size_bytes(value: object, name: str) -> int:
    """A config size in bytes: a byte count or a string like ``"40GiB"`` (:func:`elastic_pipe.types.parse_bytes`).

    Raises:
        ConfigError: naming ``name`` and the value.
    """
    try:
        return parse_bytes(value)  # type: ignore[arg-type]  # parse_bytes refuses any other type itself
    except ByteSizeError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def _nonnegative_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")


def _at_most(name: str, value: float, limit: float, limit_name: str, why: str) -> None:
    if value > limit:
        raise ConfigError(f"{name} must be <= {limit_name} = {limit:g} ({why}), got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _nonnegative_float(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _string(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")


def _table(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a table of options, got {value!r}")
    return dict(value)


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: what is trained.

    Attributes:
        name: a builder of :mod:`elastic_pipe.models` ("vit", "bert", "gpt", ...) or an import path
            ``"module:attr"`` of a function returning a :class:`~elastic_pipe.models.SubLayerModel`.
        options: keyword arguments for the builder (``preset`` is the built-ins' first positional argument).
    """

    name: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _string("model.name", self.name)
        if not self.name:
            raise ConfigError("[model] name must name a model builder (e.g. 'vit') or 'module:function'")
        object.__setattr__(self, "options", _table("model.options", self.options))


@dataclass(frozen=True)
class DataSection:
    """``[data]``: what it is trained on.

    Attributes:
        dataset: "digits", "mnist5k", or an import path ``"module:attr"`` of a function (called with
            ``options``) returning the samples: an object with ``inputs``, ``labels`` and ``sample_ids`` tensors
            (held in memory, standardised), or a map-style dataset of ``(input, label)`` pairs (read through a
            ``DataLoader``, never stacked; its transforms normalise).
        options: keyword arguments for an imported dataset function.
        eval_fraction: share of the dataset held out for evaluation (split with ``train.seed``), when there is no
            ``eval_dataset``.
        eval_dataset: the user's own validation set: an import path ``"module:attr"`` (or a built-in name) of a
            dataset, or of a function called with ``eval_options`` returning one, of the same kind as ``dataset``
            (samples in memory, or a map-style dataset). When given, all of ``dataset`` is trained on and nothing
            is held out ("": hold out ``eval_fraction``).
        eval_options: keyword arguments for an ``eval_dataset`` function.
        workers: ``DataLoader`` worker processes per rank reading a map-style dataset (0: the training process
            reads).
        drop_last: drop the ``N mod global_batch`` samples left after the full steps of an epoch (the default:
            every step has the global batch, so a run resumed into another world size continues exactly; each
            epoch record reports the count as ``dropped``), or, false, train on them in one short last step, which
            drops only what cannot split evenly over every layout the job can reach - a number that depends on the
            world size.
        check: read every item of a map-style dataset once at the start (each rank a share) to check shapes,
            dtypes and label range, so that a bad item fails every rank before the first step; false checks each
            batch only as it is read.
    """

    dataset: str = "digits"
    options: Mapping[str, Any] = field(default_factory=dict)
    eval_fraction: float = 0.2
    eval_dataset: str = ""
    eval_options: Mapping[str, Any] = field(default_factory=dict)
    workers: int = 0
    drop_last: bool = True
    check: bool = True

    def __post_init__(self) -> None:
        _string("data.dataset", self.dataset)
        object.__setattr__(self, "options", _table("data.options", self.options))
        _string("data.eval_dataset", self.eval_dataset)
        object.__setattr__(self, "eval_options", _table("data.eval_options", self.eval_options))
        if not isinstance(self.eval_fraction, int | float) or not 0.0 < self.eval_fraction < 1.0:
            raise ConfigError(f"data.eval_fraction must be in (0, 1), got {self.eval_fraction!r}")
        _nonnegative_int("data.workers", self.workers)
        for name in ("drop_last", "check"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"data.{name} must be true or false, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class TrainSection:
    """``[train]``: the optimisation.

    Attributes:
        epochs: number of epochs (at most :data:`MAX_EPOCHS`).
        global_batch: samples per optimizer step over all replicas; each replica gets ``global_batch / replicas``,
            so the batch and the learning-rate schedule do not change when the replica count does.
        lr: peak learning rate.
        optimizer: "sgd" (with ``momentum``) or "adamw" (the trainer also takes any optimizer factory object).
        momentum: SGD momentum.
        weight_decay: decoupled (AdamW) or L2 (SGD) weight decay.
        lr_schedule: "constant" or "cosine" (over all steps of the run, after ``warmup_steps`` of linear warm-up).
        warmup_steps: linear warm-up steps.
        seed: seeds the model initialisation, the data split, the sampler and the per-step dropout generators
            (below :data:`SEED_LIMIT`).
        dtype: parameter dtype, "float32" or "float64" (the equivalence tests use float64).
        autocast: "none" or "bf16" (autocast on the device for the forward passes).
        compile: "auto" (on with CUDA, off on the CPU), "on" or "off": ``torch.compile`` each sub-layer once
            (regional compilation), so identical blocks share compiled code and a transition, which only regroups
            sub-layers into new stages, compiles nothing new for the training path (a compiled stage's input always
            carries a gradient, so a stage that starts later in the model reuses the same compiled code).
        cuda_graphs: "auto" (the default: CUDA only, host-bound layouts only), "on" or "off":
            replay each layout's forward, loss and backward as a CUDA graph once it has run eagerly
            (``orchestrator/cuda_graph.py``), where that is safe: one stage, one micro-batch, one replica and a full
            step. "auto" captures a layout only if its timed warm-up step was host-bound (the host's enqueueing took at
            least half the step), "on" every safe one. Elsewhere, and for a short last step, the step runs as before and
            the epoch record says why (``graph_reason``). The freeze probe of a probe-driven policy (``drift``) is
            replayed as CUDA graphs on any layout unless "off" (``orchestrator/forward_graphs.py``).
        max_grad_norm: clip the gradient to this global L2 norm before each optimizer step (the norm over every
            trainable parameter of the whole model, whatever the layout; 0: no clipping).
        max_steps: stop after this many optimizer steps in the whole run, with an evaluation (0: no limit; the
            run also ends after ``epochs``).
        on_nonfinite: "stop" ends the run at the first NaN or infinite training loss, with one line naming the
            epoch and step (found where the losses are read back: at the epoch's end or before a transition inside
            it, before any checkpoint of that state); "continue" trains on.
    """

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
    compile: str = "auto"
    cuda_graphs: str = "auto"
    max_grad_norm: float = 0.0
    max_steps: int = 0
    on_nonfinite: str = "stop"

    def __post_init__(self) -> None:
        _positive_int("train.epochs", self.epochs)
        _one_of("train.on_nonfinite", self.on_nonfinite, ("stop", "continue"))
        _nonnegative_float("train.max_grad_norm", self.max_grad_norm)
        _nonnegative_int("train.max_steps", self.max_steps)
        _positive_int("train.global_batch", self.global_batch)
        _nonnegative_int("train.warmup_steps", self.warmup_steps)
        _nonnegative_int("train.seed", self.seed)
        if self.seed >= SEED_LIMIT:
            raise ConfigError(f"train.seed must be < SEED_LIMIT = 2**31 (a signed 32-bit integer), got {self.seed!r}")
        _at_most("train.epochs", self.epochs, MAX_EPOCHS, "MAX_EPOCHS", "a larger count is a typo")
        _positive_float("train.lr", self.lr)
        _nonnegative_float("train.momentum", self.momentum)
        _nonnegative_float("train.weight_decay", self.weight_decay)
        _one_of("train.optimizer", self.optimizer, OPTIMIZERS)
        _one_of("train.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _one_of("train.dtype", self.dtype, DTYPES)
        _one_of("train.autocast", self.autocast, AUTOCAST)
        _one_of("train.compile", self.compile, COMPILE_MODES)
        _one_of("train.cuda_graphs", self.cuda_graphs, CUDA_GRAPH_MODES)


@dataclass(frozen=True)
class FreezeSection:
    """``[freeze]``: the freeze policy.

    Attributes:
        policy: a name of :data:`elastic_pipe.freeze.POLICIES` or an import path ``"module:attr"`` of a policy
            factory, called as ``factory(num_layers, **options)`` (a policy class is such a factory). Default:
            ``"drift"`` (:data:`DEFAULT_POLICY`, the setting the accuracy study measured within 0.5 points of no
            freezing on both of its tasks).
        options: keyword arguments for the policy (alpha defaults to ``alpha = 1/3``, FreezeOut to ``t0 = 0.7``;
            a policy that takes ``total_steps``, as FreezeOut and Drift do, gets the run's optimizer steps).
        decide_every: a decision point after every ``decide_every`` optimizer steps of the run (counted over the
            whole run, across epoch boundaries), the transition applied inside the epoch when one falls there;
            0 keeps the published rhythm, one decision point after every epoch; ``"auto"``, the default, is the
            policy's own: ``decisions_per_epoch`` times per epoch for a policy that says it (Drift: 4), after every
            epoch for any other.
    """

    policy: str = DEFAULT_POLICY
    options: Mapping[str, Any] = field(default_factory=dict)
    decide_every: int | str = DECIDE_AUTO

    def __post_init__(self) -> None:
        _string("freeze.policy", self.policy)
        if not self.policy:
            raise ConfigError("freeze.policy must name a policy (e.g. 'alpha') or 'module:attr'")
        object.__setattr__(self, "options", _table("freeze.options", self.options))
        if self.decide_every != DECIDE_AUTO:
            try:
                _nonnegative_int("freeze.decide_every", self.decide_every)
            except ConfigError:
                raise ConfigError(
                    f"freeze.decide_every must be an integer >= 0 or {DECIDE_AUTO!r}, got {self.decide_every!r}"
                ) from None

    @property
    def every_steps(self) -> int:
        """``decide_every`` in optimizer steps (0: after every epoch), once resolved: a run's config always is
        (:func:`elastic_pipe.orchestrator.components.with_decisions`).

        Raises:
            ConfigError: it is still ``"auto"``, which only the policy and the data resolve.
        """
        if isinstance(self.decide_every, str):
            raise ConfigError(
                "freeze.decide_every = 'auto' is the policy's rhythm, known once the policy and the data are built "
                "(elastic_pipe.orchestrator.components.with_decisions)"
            )
        return self.decide_every

    @property
    def policy_options(self) -> dict[str, Any]:
        """The options the policy is built with: ``options``, with ``alpha = 1/3`` (the published schedule) for
        ``alpha`` without any and ``t0 = 0.7`` (:data:`DEFAULT_T0`) for ``freezeout`` without one. FreezeOut's
        ``total_steps``, when not given, is the run's length, filled in when the data is known
        (:func:`elastic_pipe.orchestrator.components.make_policy`)."""
        if self.policy == "alpha" and not self.options:
            return {"alpha": DEFAULT_ALPHA}
        if self.policy == "freezeout":
            return {"t0": DEFAULT_T0, **self.options}
        return dict(self.options)


def _cache_tiers(value: object) -> dict[str, Any]:
    """``[pipeline] cache_tiers`` checked, sizes as byte counts (so the table round-trips through ``to_dict``)."""
    table = _table("pipeline.cache_tiers", value)
    unknown = sorted(set(table) - set(CACHE_TIER_KEYS))
    if unknown:
        raise ConfigError(
            f"pipeline.cache_tiers: unknown key {unknown[0]!r}; expected one of {', '.join(CACHE_TIER_KEYS)}"
        )
    out: dict[str, Any] = {}
    for key, raw in table.items():
        if key in ("device", "host", "disk_size"):
            out[key] = size_bytes(raw, f"pipeline.cache_tiers.{key}")
        else:
            _string(f"pipeline.cache_tiers.{key}", raw)
            out[key] = raw
    if "host_kind" in out:
        _one_of("pipeline.cache_tiers.host_kind", out["host_kind"], HOST_KINDS)
    if out.get("disk_size") and not out.get("disk"):
        raise ConfigError(f"pipeline.cache_tiers.disk_size = {out['disk_size']} needs a disk directory (disk = ...)")
    if out.get("host_dir") and out.get("host_kind") == "pinned":
        raise ConfigError("pipeline.cache_tiers.host_dir is for host_kind = 'shared'; a pinned host tier has no files")
    return out


@dataclass(frozen=True)
class PipelineSection:
    """``[pipeline]``: the initial layout and how it changes.

    Attributes:
        pipe_len: initial pipeline length K; must divide the world size.
        solver: partition solver name in :data:`elastic_pipe.partition.SOLVERS`, or ``"module:attr"``.
        cost: per-sub-layer cost the partition balances: "params" (the published proxy) or "time" (profiled).
        compression: "halving" (the published rule), "memory", "none" (freeze only; length and replicas fixed), or
            ``"module:attr"`` of a :class:`~elastic_pipe.orchestrator.compression.CompressionRule` object.
        schedule: pipeline schedule kind in :data:`elastic_pipe.schedule.GENERATORS`.
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
    microbatches: int = 4
    microbatches_by_pipe_len: Mapping[int, int] = field(default_factory=dict)
    cache: str = "auto"
    cache_mb: int = 256
    cache_tiers: Mapping[str, Any] = field(default_factory=dict)
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
            _positive_int(f"pipeline.{name}", getattr(self, name))
        for name in ("solver", "schedule"):
            _string(f"pipeline.{name}", getattr(self, name))
        _one_of("pipeline.cost", self.cost, COST_METRICS)
        if ":" not in self.compression:
            _one_of("pipeline.compression", self.compression, COMPRESSIONS)
        _one_of("pipeline.cache", self.cache, CACHE_MODES)
        _one_of("pipeline.cache_policy", self.cache_policy, CACHE_POLICIES)
        _one_of("pipeline.cache_dtype", self.cache_dtype, CACHE_DTYPES)
        if self.views > 1 and self.cache_policy != "views":
            raise ConfigError(f"pipeline.views = {self.views} needs cache_policy = 'views', got {self.cache_policy!r}")
        object.__setattr__(self, "cache_tiers", _cache_tiers(self.cache_tiers))
        table: dict[int, int] = {}
        for key, value in _table("pipeline.microbatches_by_pipe_len", self.microbatches_by_pipe_len).items():
            try:
                length = int(key)  # TOML and JSON keys are strings
            except (TypeError, ValueError):
                raise ConfigError(f"microbatches_by_pipe_len keys must be pipeline lengths, got {key!r}") from None
            _positive_int(f"microbatches_by_pipe_len[{length}]", value)
            table[length] = value
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
            (:mod:`~elastic_pipe.orchestrator.rendezvous`).
    """

    nproc_per_node: int = 1
    nnodes: int = 1
    backend: str = "auto"
    timeout: float = 120.0
    max_restarts: int = 0
    rdzv_endpoint: str = ""
    run_id: str = ""

    def __post_init__(self) -> None:
        _positive_int("launch.nproc_per_node", self.nproc_per_node)
        _positive_int("launch.nnodes", self.nnodes)
        _nonnegative_int("launch.max_restarts", self.max_restarts)
        _one_of("launch.backend", self.backend, BACKENDS)
        _positive_float("launch.timeout", self.timeout)
        _at_most("launch.timeout", self.timeout, MAX_TIMEOUT_S, "MAX_TIMEOUT_S", "one day, in seconds")
        _string("launch.rdzv_endpoint", self.rdzv_endpoint)
        _string("launch.run_id", self.run_id)


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
            :data:`~elastic_pipe.orchestrator.integrity.MAX_ABS` (refused as corrupt by default).
        allow_config_change: resume although the config differs from the checkpoint's in more than a resume may
            change (:mod:`~elastic_pipe.orchestrator.rerun`); the ``resume`` record lists the changes.
    """

    dir: str = ""
    every: int = 1
    steps: int = 0
    resume: str = "auto"
    keep_last: int = 0
    allow_nonfinite: bool = False
    allow_config_change: bool = False

    def __post_init__(self) -> None:
        _string("checkpoint.dir", self.dir)
        _positive_int("checkpoint.every", self.every)
        _nonnegative_int("checkpoint.steps", self.steps)
        _one_of("checkpoint.resume", self.resume, ("auto", "never"))
        _nonnegative_int("checkpoint.keep_last", self.keep_last)
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
        _string("log.dir", self.dir)
        _positive_int("log.eval_every", self.eval_every)
        if not isinstance(self.progress, bool):
            raise ConfigError(f"log.progress must be true or false, got {self.progress!r}")
        _positive_int("log.timing_interval", self.timing_interval)
        if not isinstance(self.tensorboard, bool):
            raise ConfigError(f"log.tensorboard must be true or false, got {self.tensorboard!r}")
        if self.tensorboard and not self.dir:
            raise ConfigError("log.tensorboard = true needs log.dir: the scalars go to <dir>/tensorboard")


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
