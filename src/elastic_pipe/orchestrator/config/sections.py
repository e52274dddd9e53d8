"""The sections of what is trained and how: ``[model]``, ``[data]``, ``[train]``, ``[freeze]``; each a frozen,
validated dataclass (:class:`~elastic_pipe.orchestrator.config.TrainConfig` holds one of each).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elastic_pipe.orchestrator.config.values import (
    AUTOCAST,
    COMPILE_MODES,
    CUDA_GRAPH_MODES,
    DECIDE_AUTO,
    DEFAULT_ALPHA,
    DEFAULT_POLICY,
    DEFAULT_T0,
    DTYPES,
    LR_SCHEDULES,
    MAX_EPOCHS,
    OPTIMIZERS,
    SEED_LIMIT,
    as_table,
    check_at_most,
    check_nonnegative_float,
    check_nonnegative_int,
    check_one_of,
    check_positive_float,
    check_positive_int,
    check_string,
)
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["DataSection", "FreezeSection", "ModelSection", "TrainSection"]


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: what is trained.

    Attributes:
        name: a builder of :mod:`elastic_pipe.models` ("vit", "bert", "gpt", ...) or an import path
            ``"module:attr"`` of a function returning a :class:`~elastic_pipe.models.SubLayerModel`.
        options: keyword arguments for the builder (``preset`` is the built-ins' first positional argument).
    """

    name: str = ""
    options: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_string("model.name", self.name)
        if not self.name:
            raise ConfigError("[model] name must name a model builder (e.g. 'vit') or 'module:function'")
        object.__setattr__(self, "options", as_table("model.options", self.options))


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
    options: Mapping[str, object] = field(default_factory=dict)
    eval_fraction: float = 0.2
    eval_dataset: str = ""
    eval_options: Mapping[str, object] = field(default_factory=dict)
    workers: int = 0
    drop_last: bool = True
    check: bool = True

    def __post_init__(self) -> None:
        check_string("data.dataset", self.dataset)
        object.__setattr__(self, "options", as_table("data.options", self.options))
        check_string("data.eval_dataset", self.eval_dataset)
        object.__setattr__(self, "eval_options", as_table("data.eval_options", self.eval_options))
        if not isinstance(self.eval_fraction, int | float) or not 0.0 < self.eval_fraction < 1.0:
            raise ConfigError(f"data.eval_fraction must be in (0, 1), got {self.eval_fraction!r}")
        check_nonnegative_int("data.workers", self.workers)
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
            (``stage/graphed_step.py``), where that is safe: one stage, one micro-batch, one replica and a full
            step. "auto" captures a layout only if its timed warm-up step was host-bound (the host's enqueueing took at
            least half the step), "on" every safe one. Elsewhere, and for a short last step, the step runs as before and
            the epoch record says why (``graph_reason``). The freeze probe of a probe-driven policy (``drift``) is
            replayed as CUDA graphs on any layout unless "off" (``stage/forward_graphs.py``).
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
        check_positive_int("train.epochs", self.epochs)
        check_one_of("train.on_nonfinite", self.on_nonfinite, ("stop", "continue"))
        check_nonnegative_float("train.max_grad_norm", self.max_grad_norm)
        check_nonnegative_int("train.max_steps", self.max_steps)
        check_positive_int("train.global_batch", self.global_batch)
        check_nonnegative_int("train.warmup_steps", self.warmup_steps)
        check_nonnegative_int("train.seed", self.seed)
        if self.seed >= SEED_LIMIT:
            raise ConfigError(f"train.seed must be < SEED_LIMIT = 2**31 (a signed 32-bit integer), got {self.seed!r}")
        check_at_most("train.epochs", self.epochs, MAX_EPOCHS, "MAX_EPOCHS", "a larger count is a typo")
        check_positive_float("train.lr", self.lr)
        check_nonnegative_float("train.momentum", self.momentum)
        check_nonnegative_float("train.weight_decay", self.weight_decay)
        check_one_of("train.optimizer", self.optimizer, OPTIMIZERS)
        check_one_of("train.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_one_of("train.dtype", self.dtype, DTYPES)
        check_one_of("train.autocast", self.autocast, AUTOCAST)
        check_one_of("train.compile", self.compile, COMPILE_MODES)
        check_one_of("train.cuda_graphs", self.cuda_graphs, CUDA_GRAPH_MODES)

    def run_steps(self, steps_per_epoch: int) -> int:
        """The optimizer steps of the whole run: :attr:`epochs` of ``steps_per_epoch``, or :attr:`max_steps` when
        that comes sooner."""
        total = self.epochs * steps_per_epoch
        return min(total, self.max_steps) if self.max_steps else total


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
    options: Mapping[str, object] = field(default_factory=dict)
    decide_every: int | str = DECIDE_AUTO

    def __post_init__(self) -> None:
        check_string("freeze.policy", self.policy)
        if not self.policy:
            raise ConfigError("freeze.policy must name a policy (e.g. 'alpha') or 'module:attr'")
        object.__setattr__(self, "options", as_table("freeze.options", self.options))
        if self.decide_every != DECIDE_AUTO:
            try:
                check_nonnegative_int("freeze.decide_every", self.decide_every)
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
    def policy_options(self) -> dict[str, object]:
        """The options the policy is built with: ``options``, with ``alpha = 1/3`` (the published schedule) for
        ``alpha`` without any and ``t0 = 0.7`` (:data:`DEFAULT_T0`) for ``freezeout`` without one. FreezeOut's
        ``total_steps``, when not given, is the run's length, filled in when the data is known
        (:func:`elastic_pipe.orchestrator.components.make_policy`)."""
        if self.policy == "alpha" and not self.options:
            return {"alpha": DEFAULT_ALPHA}
        if self.policy == "freezeout":
            return {"t0": DEFAULT_T0, **self.options}
        return dict(self.options)
