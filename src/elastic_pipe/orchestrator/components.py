"""The parts a trainer composes, and the one function that turns a config of names into them.

:class:`Components` holds built objects: the model, the data, the freeze policy, the partition solver, the
compression rule, the schedule kind, the optimizer factory and the loss. :class:`~elastic_pipe.orchestrator.trainer.
ElasticTrainer` takes them directly; :func:`components_from_config` builds them from a :class:`TrainConfig` and is
the only reader of the registries (``freeze.POLICIES``, ``partition.SOLVERS``, the model builders, the datasets).

Wherever a registry name is accepted, so is an import path ``"package.module:attribute"``: it is imported in the
process that resolves it, so under ``elastic-pipe train`` (spawned workers) and torchrun alike every worker finds the
user's own policy, model or dataset without anything being registered.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
from torch import nn

from elastic_pipe import data as edata
from elastic_pipe import freeze, models, partition
from elastic_pipe import schedule as sched
from elastic_pipe.orchestrator.compression import COMPRESSION_RULES, CompressionRule
from elastic_pipe.orchestrator.config import DECIDE_AUTO, TrainConfig
from elastic_pipe.orchestrator.epoch_steps import epoch_plan, reachable_pipe_lens, split_unit
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.optim import OptimizerFactory, optimizer_factory
from elastic_pipe.orchestrator.text_data import bbcnews
from elastic_pipe.orchestrator.workload import (
    Loss,
    Samples,
    as_data,
    cross_entropy,
    eval_count,
    is_samples,
    num_samples,
)
from elastic_pipe.types import ElasticPipeError

__all__ = [
    "DATASETS",
    "KEYS",
    "MODEL_BUILDERS",
    "STAGES_PER_RANK",
    "Components",
    "adapt_policy",
    "build_model",
    "check_runnable_schedule",
    "components_from_config",
    "decision_interval",
    "epoch_steps",
    "load_eval_samples",
    "load_samples",
    "make_policy",
    "resolve",
    "run_steps",
    "with_decisions",
]

T = TypeVar("T")

#: Model name in a config -> builder in :mod:`elastic_pipe.models`.
MODEL_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "vit": models.vit,
    "bert": models.bert_encoder,
    "gpt": models.gpt_decoder,
    "minilm": models.load_minilm,  # the pretrained all-MiniLM-L6-v2; options: num_classes (the new head)
}
#: Datasets that need a model's tokenizer, which :mod:`elastic_pipe.data` (a primitive) may not import.
_TOKENISED_DATASETS: dict[str, Callable[..., Samples | Any]] = {
    "bbcnews": bbcnews,  # a tokenised map-style dataset (orchestrator.text_data)
}
#: Dataset name in a config -> loader: a read-through view of the one registry, :data:`elastic_pipe.data.DATASETS`
#: (a dataset added there is a config name at once), plus the tokenised text datasets above.
DATASETS: Mapping[str, Callable[..., Samples | Any]] = ChainMap(
    _TOKENISED_DATASETS,
    cast("dict[str, Callable[..., Samples | Any]]", edata.DATASETS),  # read only: a ChainMap writes to its first map
)


#: What is looked up -> the config key that names it (error messages name the key).
KEYS = {
    "model": "[model] name",
    "dataset": "[data] dataset",
    "eval dataset": "[data] eval_dataset",
    "freeze policy": "[freeze] policy",
    "partition solver": "[pipeline] solver",
    "compression rule": "[pipeline] compression",
}


def resolve(spec: str, registry: Mapping[str, T], kind: str) -> T:
    """A registry entry by name, or any object by import path ``"module:attribute"``.

    Args:
        spec: a key of ``registry``, or ``"package.module:attr"`` (dots after the colon walk attributes).
        registry: the built-in names.
        kind: what is looked up, for the error message ("freeze policy", "model", ...).

    Raises:
        ConfigError: an unknown name (listing the valid ones), or an import path that does not import (one line
            naming the config key and the module; ``elastic-pipe train`` puts the current directory and the
            config file's directory on ``sys.path``, as ``python -m`` and torchrun put the script's).
    """
    if ":" not in spec:
        if spec not in registry:
            raise ConfigError(
                f"unknown {kind} {spec!r}; expected one of {', '.join(sorted(registry))} or 'module:attribute'"
            )
        return registry[spec]
    module_name, _, attr = spec.partition(":")
    key = KEYS.get(kind, kind)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{kind} {spec!r} ({key}): cannot import {module_name!r}: {exc}; it must be importable from the current "
            "directory, the config file's directory or PYTHONPATH"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"{kind} {spec!r} ({key}): importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not part or not hasattr(obj, part):
            raise ConfigError(f"{kind} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


@dataclass
class Components:
    """Everything a trainer composes, built.

    Attributes:
        model: a :class:`~elastic_pipe.models.SubLayerModel` (``unit_ends``): with real weights, seeded identically on
            every rank, or on the meta device with a ``sublayer_init`` (what :func:`build_model` gives the trainer).
        data: samples held in memory (``inputs``, ``labels``, ``sample_ids`` tensors), or a map-style dataset of
            ``(input, label)`` pairs, kept as it is (each rank reads it through a ``DataLoader``).
        policy: a full :class:`~elastic_pipe.freeze.FreezePolicy` over the model's units (:func:`adapt_policy`
            completes what the user gave).
        partitioner: a solver name of :data:`elastic_pipe.partition.SOLVERS` or a solver function
            (``partition.optimal``).
        compression: a :class:`~elastic_pipe.orchestrator.compression.CompressionRule`.
        schedule: a schedule kind of :data:`elastic_pipe.schedule.GENERATORS` ("gpipe", "1f1b", ...).
        optimizer: builds the optimizer over a list of trainable parameters.
        loss: ``loss(output, target)``, a mean over the micro-batch.
        eval_data: the user's validation set, of the same kind as ``data``; ``None``: ``[data] eval_fraction`` of
            ``data`` is held out instead.
    """

    model: nn.Module
    data: Samples | Any
    policy: freeze.FreezePolicy
    partitioner: str | partition.Solver = "greedy"
    compression: CompressionRule = field(default_factory=lambda: COMPRESSION_RULES["halving"])
    schedule: str = "gpipe"
    optimizer: OptimizerFactory | None = None
    loss: Loss = cross_entropy
    eval_data: Samples | Any | None = None


def build_model(config: TrainConfig, *, meta: bool = False) -> nn.Module:
    """Build the config's model, seeded with ``train.seed`` and in ``train.dtype``, on the CPU (or the meta device).

    A built-in builder gets ``options`` (``preset`` is its first positional argument) plus ``seed``, ``dtype`` and
    ``meta``; a builder given by import path gets ``options`` alone, under a seeded global generator, and its model
    is cast (it may build on the meta device itself and set ``sublayer_init``, see
    :mod:`elastic_pipe.models.weights`).

    Args:
        config: the run's config.
        meta: built-in models only: build on the meta device with their recipe (``sublayer_init``), so that each
            rank materializes only what it holds; the values are those of ``meta=False``, sub-layer by sub-layer.
            What the trainer builds.

    Raises:
        ConfigError: an unknown model name, bad options, or a builder that did not return a module.
    """
    spec = config.model.name
    builder = resolve(spec, MODEL_BUILDERS, "model")
    options = dict(config.model.options)
    dtype = getattr(torch, config.train.dtype)
    try:
        if spec in MODEL_BUILDERS:
            preset = options.pop("preset", None)
            args = () if preset is None else (preset,)
            model = builder(*args, seed=config.train.seed, dtype=dtype, meta=meta, **options)
        else:
            torch.manual_seed(config.train.seed)
            model = builder(**options)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"model {spec!r} with options {dict(config.model.options)}: {exc}") from None
    if not isinstance(model, nn.Module) or not hasattr(model, "unit_ends"):
        raise ConfigError(f"model {spec!r} built {type(model).__name__}, expected a SubLayerModel (with unit_ends)")
    return model.to(dtype)


def load_samples(config: TrainConfig) -> Samples | Any:
    """Load the config's dataset: a built-in one by name, or the result of ``factory(**options)`` by import path
    (samples held in memory, or a map-style dataset, which is not read here).

    Raises:
        ConfigError: an unknown dataset name, or something that is neither samples nor a dataset.
    """
    spec = config.data.dataset
    loader = resolve(spec, DATASETS, "dataset")
    try:
        loaded = loader(**config.data.options)  # built-ins take options too (bbcnews: max_tokens)
        return as_data(loaded)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"dataset {spec!r}: {exc}") from None


def load_eval_samples(config: TrainConfig) -> Samples | Any | None:
    """The user's validation set that ``[data] eval_dataset`` names (``None`` when it names none): a dataset
    object as it is, or what a function returns when called with ``[data] eval_options``.

    Raises:
        ConfigError: an unknown name, an import path that does not import, or something that is no data.
    """
    spec = config.data.eval_dataset
    if not spec:
        return None
    found: Any = resolve(spec, DATASETS, "eval dataset")
    try:
        # a function or a Dataset class is called with the options; a dataset object is taken as it is
        is_data = not isinstance(found, type) and (hasattr(found, "__getitem__") or hasattr(found, "inputs"))
        loaded = found if is_data else found(**config.data.eval_options)
        return as_data(loaded)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"eval dataset {spec!r}: {exc}") from None


def epoch_steps(config: TrainConfig, samples: int, *, own_eval: bool | None = None) -> int | None:
    """Optimizer steps per epoch of ``config`` on a dataset of ``samples``, cut as the trainer cuts them
    (:func:`.epoch_steps.epoch_plan`); ``None`` when the batch does not split over the reachable layouts (the
    trainer's own check names that).

    Args:
        config: the run's config.
        samples: the training data's size.
        own_eval: whether the run has its own validation set (nothing held out); default: whether
            ``[data] eval_dataset`` names one.
    """
    unit = split_unit(
        config.world_size,
        reachable_pipe_lens(config.pipeline.pipe_len, config.world_size),
        config.microbatches_for,
    )
    if config.train.global_batch % unit:
        return None
    own = bool(config.data.eval_dataset) if own_eval is None else own_eval
    train = samples if own else samples - eval_count(samples, config.data.eval_fraction)
    return epoch_plan(train, config.train.global_batch, unit, drop_last=config.data.drop_last).steps


def run_steps(config: TrainConfig, samples: int, *, own_eval: bool | None = None) -> int | None:
    """The optimizer steps of the whole run (its epochs, or ``max_steps`` when that comes sooner)."""
    per_epoch = epoch_steps(config, samples, own_eval=own_eval)
    if per_epoch is None:
        return None
    total = per_epoch * config.train.epochs
    return min(total, config.train.max_steps) if config.train.max_steps else total


def decision_interval(
    config: TrainConfig, policy: freeze.FreezePolicy, samples: int, *, own_eval: bool | None = None
) -> int:
    """``[freeze] decide_every`` in optimizer steps (0: a decision point after every epoch).

    An integer is taken as it is. ``"auto"`` is the policy's rhythm: a policy with ``decisions_per_epoch = n``
    (Drift: 4, the rhythm its defaults were measured at) decides every ``steps_per_epoch // n`` steps, any other
    after every epoch (the published rhythm).
    """
    every = config.freeze.decide_every
    if every != DECIDE_AUTO:
        return int(every)
    n = getattr(policy, "decisions_per_epoch", None)
    per_epoch = epoch_steps(config, samples, own_eval=own_eval)
    if isinstance(n, bool) or not isinstance(n, int) or n <= 1 or not per_epoch:
        return 0
    return max(1, per_epoch // n)


def with_decisions(
    config: TrainConfig, policy: freeze.FreezePolicy, samples: int, *, own_eval: bool | None = None
) -> TrainConfig:
    """``config`` with ``[freeze] decide_every`` resolved to steps (:func:`decision_interval`): what a run reads."""
    every = decision_interval(config, policy, samples, own_eval=own_eval)
    if every == config.freeze.decide_every:
        return config
    return dataclasses.replace(config, freeze=dataclasses.replace(config.freeze, decide_every=every))


def make_policy(config: TrainConfig, num_units: int, *, total_steps: int | None = None) -> freeze.FreezePolicy:
    """The config's freeze policy over ``num_units`` units (registry name or import path of a factory).

    Args:
        config: the run's config.
        num_units: the model's freeze units.
        total_steps: the run's optimizer steps (:func:`run_steps`): the ``total_steps`` of a policy that takes one
            (FreezeOut, Drift) when the config gives none.

    Raises:
        ConfigError: an unknown name, options the factory does not take, or an object that is not a policy.
    """
    spec = config.freeze.policy
    factory = resolve(spec, freeze.POLICIES, "freeze policy")
    options = config.freeze.policy_options
    if spec not in freeze.POLICIES and freeze.is_policy_function(factory, **options):
        if options:
            raise ConfigError(
                f"freeze policy {spec!r} is a function (epoch, step, current) -> int, which takes no options; "
                f"got {options}"
            )
        return adapt_policy(factory, num_units, f"freeze policy {spec!r}")
    if "total_steps" not in options and total_steps is not None and freeze.takes_total_steps(factory):
        options["total_steps"] = max(1, total_steps)
    try:
        if spec in freeze.POLICIES:
            return freeze.make_policy(spec, num_units, **options)
        policy = factory(num_units, **options)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"freeze policy {spec!r} with options {options}: {exc}") from None
    return adapt_policy(policy, num_units, f"freeze policy {spec!r}")


def adapt_policy(policy: object, num_units: int, what: str = "policy") -> freeze.FreezePolicy:
    """The one place a user's policy becomes a full :class:`~elastic_pipe.freeze.FreezePolicy`
    (:func:`elastic_pipe.freeze.as_policy`: an object with ``num_layers`` and ``propose`` gets the documented
    defaults, a function ``(epoch, step, current) -> int`` is wrapped over the model's units).

    Raises:
        ConfigError: ``policy`` is none of these, or its ``num_layers`` is not the model's ``num_units`` (it counts
            freeze units, ``len(model.unit_ends)``).
    """
    try:
        full = freeze.as_policy(policy, num_units)
    except ElasticPipeError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if full.num_layers != num_units:
        raise ConfigError(
            f"{what} {full.name!r} has num_layers={full.num_layers!r}, but the model has {num_units} freeze units; "
            f"expected num_layers={num_units} (it counts units: len(model.unit_ends))"
        )
    return full


#: Stages one rank holds: the runtime builds one ``PipelineStage`` per rank (several per rank is a later issue), so
#: a schedule whose generator needs more (``interleaved``) cannot run.
STAGES_PER_RANK = 1


def check_runnable_schedule(schedule: str) -> None:
    """Refuse a registered schedule the runtime cannot run, before any process starts.

    The runtime holds :data:`STAGES_PER_RANK` stage per rank; a schedule whose generator refuses that placement
    (:func:`elastic_pipe.schedule.generate` on one rank and one micro-batch) would fail on every rank at its first
    runner build.

    Raises:
        ConfigError: one line naming the schedule and the generator's reason.
    """
    try:
        sched.generate(schedule, 1, 1, STAGES_PER_RANK)
    except sched.ScheduleError as exc:
        raise ConfigError(
            f"pipeline.schedule {schedule!r} cannot run here: the trainer holds one stage per rank and {exc}"
        ) from None


def components_from_config(
    config: TrainConfig,
    *,
    model: nn.Module | None = None,
    data: Any = None,
    policy: freeze.PolicyLike | None = None,
    partitioner: str | partition.Solver | None = None,
    compression: CompressionRule | None = None,
    schedule: str | None = None,
    optimizer: OptimizerFactory | None = None,
    loss: Loss | None = None,
    eval_data: Any = None,
) -> Components:
    """Build every component a :class:`TrainConfig` names (the only reader of the registries).

    Each keyword given is used as it is instead of what the config names.

    Raises:
        ConfigError: naming the bad value and the valid choices.
    """
    p = config.pipeline
    # on the meta device: each rank materializes only the sub-layers it holds (holdings.hold)
    model = model if model is not None else build_model(config, meta=True)
    samples = as_data(data) if data is not None else load_samples(config)
    held = as_data(eval_data) if eval_data is not None else load_eval_samples(config)
    if held is not None and is_samples(held) != is_samples(samples):
        raise ConfigError("the evaluation data and the training data must be of one kind: samples or datasets")
    if partitioner is None:
        partitioner = p.solver
        if ":" in p.solver:
            partitioner = resolve(p.solver, partition.SOLVERS, "partition solver")
            if not callable(partitioner):
                raise ConfigError(
                    f"partition solver {p.solver!r} ([pipeline] solver) is a {type(partitioner).__name__}, not "
                    "callable: expected a function (costs, stages, **options) -> layers per stage"
                )
        elif p.solver not in partition.SOLVERS:
            raise ConfigError(f"unknown partition solver {p.solver!r}; expected one of {', '.join(partition.SOLVERS)}")
    given = compression is not None
    if compression is None:
        compression = resolve(p.compression, COMPRESSION_RULES, "compression rule")
    if not isinstance(compression, CompressionRule):
        raise ConfigError(
            f"compression {compression!r}{'' if given else f' ([pipeline] compression {p.compression!r})'} lacks "
            "the CompressionRule members (name, keeps_length, and a call (active, pipe_len, budget, *, world_size, "
            "solver) -> Partition)"
        )
    schedule = schedule if schedule is not None else p.schedule
    if schedule not in sched.GENERATORS:
        raise ConfigError(f"unknown schedule {schedule!r}; expected one of {', '.join(sched.GENERATORS)}")
    check_runnable_schedule(schedule)
    if policy is None:
        total = run_steps(config, num_samples(samples), own_eval=held is not None)
        policy = make_policy(config, len(model.unit_ends), total_steps=total)  # type: ignore[arg-type]
    else:
        policy = adapt_policy(policy, len(model.unit_ends))  # type: ignore[arg-type]
    return Components(
        model=model,
        data=samples,
        policy=policy,
        partitioner=partitioner,
        compression=compression,
        schedule=schedule,
        optimizer=optimizer if optimizer is not None else optimizer_factory(config),
        loss=loss if loss is not None else cross_entropy,
        eval_data=held,
    )
