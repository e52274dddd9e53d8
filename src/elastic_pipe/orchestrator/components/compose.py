"""The composed parts of a run (:class:`Components`) and :func:`components_from_config`, which builds each part a
config names (each keyword given is used instead).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, Unpack

from elastic_pipe import freeze, partition
from elastic_pipe import schedule as sched
from elastic_pipe.orchestrator.components.lookup import resolve
from elastic_pipe.orchestrator.components.policy import adapt_policy, make_policy
from elastic_pipe.orchestrator.components.registry import build_model, load_eval_samples, load_samples
from elastic_pipe.orchestrator.components.steps import run_steps
from elastic_pipe.orchestrator.data import (
    Data,
    Loss,
    as_data,
    cross_entropy,
    is_samples,
    num_samples,
    reachable_pipe_lens,
)
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.layout import COMPRESSION_RULES, CompressionRule
from elastic_pipe.orchestrator.optim import OptimizerFactory, optimizer_factory

if TYPE_CHECKING:
    from elastic_pipe.models import SubLayerModel
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["Components", "Overrides", "check_runnable_schedule", "components_from_config"]


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
        compression: a :class:`~elastic_pipe.orchestrator.layout.compression.CompressionRule`.
        schedule: a schedule kind of :data:`elastic_pipe.schedule.GENERATORS` ("gpipe", "1f1b", ...).
        optimizer: builds the optimizer over a list of trainable parameters.
        loss: ``loss(output, target)``, a mean over the micro-batch.
        eval_data: the user's validation set, of the same kind as ``data``; ``None``: ``[data] eval_fraction`` of
            ``data`` is held out instead.
    """

    model: SubLayerModel
    data: Data
    policy: freeze.FreezePolicy
    partitioner: str | partition.Solver = "greedy"
    compression: CompressionRule = field(default_factory=lambda: COMPRESSION_RULES["halving"])
    schedule: str = "gpipe"
    optimizer: OptimizerFactory | None = None
    loss: Loss = cross_entropy
    eval_data: Data | None = None


def check_runnable_schedule(
    schedule: str,
    virtual: int | str = 1,
    *,
    shapes: Iterable[tuple[int, int]] = ((1, 1),),
) -> None:
    """Refuse a registered schedule the runtime cannot run with ``virtual`` stages per rank, before any process
    starts.

    The runtime builds one ``PipelineStage`` per stage a rank holds (``[pipeline] virtual``, loop placement), so it
    runs what the schedule's generator accepts for that placement (:func:`elastic_pipe.schedule.refusal`):
    ``gpipe`` with any v, ``1f1b`` and ``zb1p`` with v = 1, ``interleaved`` with v >= 2 and micro-batches a multiple
    of the pipeline length. With ``"auto"`` every shape needs some v up to
    :data:`~elastic_pipe.schedule.MAX_AUTO_VIRTUAL` the generator accepts.

    Args:
        schedule: a registered schedule kind.
        virtual: stages per rank, or ``"auto"``.
        shapes: the ``(pipeline length, micro-batches)`` pairs the run may reach.

    Raises:
        ConfigError: one line naming the schedule, v and the generator's reason (for ``"auto"``, its reason for
            the largest v tried).
    """
    tried = range(1, sched.MAX_AUTO_VIRTUAL + 1) if virtual == "auto" else (int(virtual),)
    shown = repr(virtual) if isinstance(virtual, str) else f"{virtual} stage(s) per rank"
    for ranks, microbatches in shapes:
        reasons = [sched.refusal(schedule, ranks, microbatches, v) for v in tried]
        if None not in reasons:
            raise ConfigError(
                f"pipeline.schedule {schedule!r} cannot run here with pipeline.virtual = {shown}: {reasons[-1]}"
            )


class Overrides(TypedDict, total=False):
    """The components a caller gives instead of what the config names (every key optional; ``None`` is not
    given): the keywords of :func:`components_from_config` and of
    :class:`~elastic_pipe.orchestrator.trainer.ElasticTrainer`, whose docstring says what each may be."""

    model: SubLayerModel | None
    data: object
    policy: freeze.PolicyLike | None
    partitioner: str | partition.Solver | None
    compression: CompressionRule | None
    schedule: str | None
    optimizer: OptimizerFactory | None
    loss: Loss | None
    eval_data: object


def components_from_config(config: TrainConfig, **given: Unpack[Overrides]) -> Components:
    """Build every component a :class:`TrainConfig` names (the only reader of the registries).

    Each component given (:class:`Overrides`) is used as it is instead of what the config names.

    Raises:
        ConfigError: naming the bad value and the valid choices.
    """
    model, data, eval_data = given.get("model"), given.get("data"), given.get("eval_data")
    policy, partitioner, compression = given.get("policy"), given.get("partitioner"), given.get("compression")
    schedule, optimizer, loss = given.get("schedule"), given.get("optimizer"), given.get("loss")
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
    named = compression is None  # by the config
    if compression is None:
        compression = resolve(p.compression, COMPRESSION_RULES, "compression rule")
    if not isinstance(compression, CompressionRule):
        raise ConfigError(
            f"compression {compression!r}{f' ([pipeline] compression {p.compression!r})' if named else ''} lacks "
            "the CompressionRule members (name, keeps_length, and a call (active, pipe_len, budget, *, world_size, "
            "solver) -> Partition)"
        )
    schedule = schedule if schedule is not None else p.schedule
    if schedule not in sched.GENERATORS:
        raise ConfigError(f"unknown schedule {schedule!r}; expected one of {', '.join(sched.GENERATORS)}")
    shapes = [(k, config.microbatches_for(k)) for k in reachable_pipe_lens(p.pipe_len, config.world_size)]
    check_runnable_schedule(schedule, p.virtual, shapes=shapes)
    if policy is None:
        total = run_steps(config, num_samples(samples), own_eval=held is not None)
        policy = make_policy(config, len(model.unit_ends), total_steps=total)
    else:
        policy = adapt_policy(policy, len(model.unit_ends))
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
