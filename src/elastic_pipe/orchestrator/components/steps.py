"""A run's step counts and decision rhythm, computed from its config and its data's size as the trainer cuts them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from elastic_pipe import freeze
from elastic_pipe.orchestrator.data import epoch_plan, eval_count, reachable_pipe_lens, split_unit

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["decision_interval", "epoch_steps", "run_steps", "with_decisions"]


def epoch_steps(config: TrainConfig, samples: int, *, own_eval: bool | None = None) -> int | None:
    """Optimizer steps per epoch of ``config`` on a dataset of ``samples``, cut as the trainer cuts them
    (:func:`~elastic_pipe.orchestrator.data.epoch_plan`); ``None`` when the batch does not split over the reachable
    layouts (the trainer's own check names that).

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
    return None if per_epoch is None else config.train.run_steps(per_epoch)


def decision_interval(
    config: TrainConfig, policy: freeze.FreezePolicy, samples: int, *, own_eval: bool | None = None
) -> int:
    """``[freeze] decide_every`` in optimizer steps (0: a decision point after every epoch).

    An integer is taken as it is. ``"auto"`` is the policy's rhythm: a policy with ``decisions_per_epoch = n``
    (Drift: 4, the rhythm its defaults were measured at) decides every ``steps_per_epoch // n`` steps, any other
    after every epoch (the published rhythm).
    """
    every = config.freeze.decide_every
    if not isinstance(every, str):  # the one string the config takes is "auto" (config.DECIDE_AUTO)
        return every
    n = freeze.decisions_per_epoch(policy)
    per_epoch = epoch_steps(config, samples, own_eval=own_eval)
    if n <= 1 or not per_epoch:
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
