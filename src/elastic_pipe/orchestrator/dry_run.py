"""What a run will do, without running it: the per-epoch layouts a config leads to, and its decision points.

``elastic-pipe plan --config run.toml`` prints this; ``elastic-pipe train --config run.toml`` then performs the
same sequence, because both build the components with :func:`components_from_config`, price the sub-layers the
same way and call the one layout rule (:func:`elastic_pipe.orchestrator.layout.rule.layout_sequence` for a decision
point after every epoch; :func:`~elastic_pipe.orchestrator.layout.rule.decide_units` and
:func:`~elastic_pipe.orchestrator.layout.rule.next_layout` at every ``[freeze] decide_every`` steps otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_pipe import freeze
from elastic_pipe.orchestrator.components import Components, components_from_config, epoch_steps, with_decisions
from elastic_pipe.orchestrator.data import num_samples
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.layout import (
    decide_units,
    frozen_sublayers,
    layout_sequence,
    next_layout,
    virtual_rule,
)
from elastic_pipe.orchestrator.setup import candidate_pipe_lens, memory_budget, planned_start, sublayer_costs

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.types import Layout

__all__ = ["planned_decisions", "planned_epochs"]


def _row(units: int, layout: Layout) -> dict[str, object]:
    return {
        "frozen_units": units,
        "frozen": layout.frozen,
        "pipe_len": layout.pipe_len,
        "replicas": layout.replicas,
        "boundaries": list(layout.boundaries),
        "microbatches": layout.microbatches,
        "virtual": layout.virtual,
    }


def _plannable(config: TrainConfig) -> tuple[TrainConfig, Components, int]:
    """The config with ``[freeze] decide_every`` in steps, the built components and the steps per epoch, or why the
    run cannot be planned."""
    parts = components_from_config(config)
    if parts.policy.needs_stats or freeze.needs_probe(parts.policy):
        raise ConfigError(
            f"freeze policy {config.freeze.policy!r} decides from signals measured while training, "
            "so its layouts cannot be planned; plan with a schedule (alpha, freezeout, manual, never)"
        )
    if config.pipeline.cost == "time":
        raise ConfigError("[pipeline] cost = 'time' is profiled on the run's device; plan with cost = 'params'")
    steps = epoch_steps(config, num_samples(parts.data))
    if steps is None:
        raise ConfigError(f"train.global_batch = {config.train.global_batch} does not split over the layouts")
    return with_decisions(config, parts.policy, num_samples(parts.data)), parts, steps


def _every_n_steps(
    config: TrainConfig, parts: Components, steps: int
) -> tuple[list[dict[str, object]], list[tuple[int, Layout]]]:
    """The decision points of ``[freeze] decide_every`` and ``(frozen units, layout)`` of each epoch's last step."""
    every = config.freeze.every_steps
    costs = sublayer_costs(parts.model)
    unit_ends = tuple(parts.model.unit_ends)
    memory = memory_budget(config, parts.model)
    virtual = virtual_rule(config.pipeline.virtual, parts.schedule)
    layout, budget = planned_start(config, parts)
    total = config.train.run_steps(steps)
    units = 0
    points: list[dict[str, object]] = []
    ends = [(units, layout)]
    for step in range(every, total, every):  # none after the run's last step
        epoch, inside = divmod(step, steps)
        while len(ends) <= epoch:  # epochs ended before this decision point keep the layout they ended with
            ends.append((units, layout))
        units = decide_units(
            parts.policy,
            epoch=epoch,
            step=step,
            current=units,
            unit_ends=unit_ends,
            num_sublayers=len(costs),
            pipe_len=layout.pipe_len,
            compression=parts.compression,
            virtual=virtual,
        )
        new = next_layout(
            layout,
            frozen_sublayers(unit_ends, units),
            costs,
            compression=parts.compression,
            solver=parts.partitioner,
            budget=budget,
            world_size=config.world_size,
            microbatches_for=config.microbatches_for,
            memory=memory,
            virtual=virtual,
        )
        points.append(
            {"step": step, "epoch": epoch, "epoch_step": inside, "changed": new != layout, **_row(units, new)}
        )
        layout = new
        ends[epoch] = (units, layout)
    while len(ends) < config.train.epochs:
        ends.append((units, layout))
    return points, ends


def planned_decisions(config: TrainConfig) -> list[dict[str, object]]:
    """Per decision point of ``[freeze] decide_every = N`` (empty when it is 0): ``{"step", "epoch", "epoch_step",
    "changed", "frozen_units", "frozen", "pipe_len", "replicas", "boundaries", "microbatches", "virtual"}`` - the
    run's step count, the epoch the next step belongs to and the steps of it done, whether the layout changed, and
    the layout after the decision.

    Raises:
        ConfigError: as :func:`planned_epochs`.
    """
    config, parts, steps = _plannable(config)
    if not config.freeze.every_steps:
        return []
    return _every_n_steps(config, parts, steps)[0]


def planned_epochs(config: TrainConfig) -> list[dict[str, object]]:
    """Per epoch: ``{"epoch", "frozen_units", "frozen", "pipe_len", "replicas", "boundaries", "microbatches",
    "virtual"}`` (``virtual``: the layout's stages per rank, the rule's choice under ``"auto"``), the
    layout of the epoch's last step (with a decision point after every epoch, the layout of the whole epoch).

    Raises:
        ConfigError: the policy decides from measured statistics (its decisions exist only once training runs),
            or the config prices sub-layers by profiled time (measured on the run's own device).
    """
    config, parts, steps = _plannable(config)
    if config.freeze.every_steps:
        sequence = _every_n_steps(config, parts, steps)[1]
    else:
        sequence = layout_sequence(
            sublayer_costs(parts.model),
            tuple(parts.model.unit_ends),
            parts.policy,
            epochs=config.train.epochs,
            steps_per_epoch=steps,
            pipe_len=config.pipeline.pipe_len,
            world_size=config.world_size,
            compression=parts.compression,
            solver=parts.partitioner,
            microbatches_for=config.microbatches_for,
            pipe_lens=candidate_pipe_lens(config),
            memory=memory_budget(config, parts.model),
            virtual=virtual_rule(config.pipeline.virtual, parts.schedule),
        )
    return [{"epoch": epoch, **_row(units, layout)} for epoch, (units, layout) in enumerate(sequence)]
