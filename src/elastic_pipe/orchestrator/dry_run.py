"""What a run will do, without running it: the per-epoch layouts a config leads to.

``elastic-pipe plan --config run.toml`` prints this; ``elastic-pipe train --config run.toml`` then performs the
same sequence, because both build the components with :func:`components_from_config`, price the sub-layers the
same way and call the one layout rule (:func:`elastic_pipe.orchestrator.layout_rule.layout_sequence`).
"""

from __future__ import annotations

from typing import Any

from elastic_pipe.orchestrator.components import components_from_config
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.layout_rule import layout_sequence
from elastic_pipe.orchestrator.setup import candidate_pipe_lens
from elastic_pipe.orchestrator.step_data import epoch_plan, split_unit
from elastic_pipe.orchestrator.trainer import sublayer_costs
from elastic_pipe.orchestrator.workload import eval_count, num_samples

__all__ = ["planned_epochs"]


def planned_epochs(config: TrainConfig) -> list[dict[str, Any]]:
    """Per epoch: ``{"epoch", "frozen_units", "frozen", "pipe_len", "replicas", "boundaries", "microbatches"}``.

    Raises:
        ConfigError: the policy decides from measured statistics (its decisions exist only once training runs),
            or the config prices sub-layers by profiled time (measured on the run's own device).
    """
    parts = components_from_config(config)
    if parts.policy.needs_stats:
        raise ConfigError(
            f"freeze policy {config.freeze.policy!r} decides from gradient statistics measured while training, "
            "so its layouts cannot be planned; plan with a schedule (alpha, freezeout, manual, never)"
        )
    if config.pipeline.cost == "time":
        raise ConfigError("[pipeline] cost = 'time' is profiled on the run's device; plan with cost = 'params'")
    n = num_samples(parts.data)
    unit = split_unit(config.world_size, candidate_pipe_lens(config), config.microbatches_for)
    plan = epoch_plan(
        n - eval_count(n, config.data.eval_fraction), config.train.global_batch, unit, drop_last=config.data.drop_last
    )
    steps = plan.steps
    sequence = layout_sequence(
        sublayer_costs(parts.model),
        tuple(parts.model.unit_ends),  # type: ignore[arg-type]
        parts.policy,
        epochs=config.train.epochs,
        steps_per_epoch=steps,
        pipe_len=config.pipeline.pipe_len,
        world_size=config.world_size,
        compression=parts.compression,
        solver=parts.partitioner,
        microbatches_for=config.microbatches_for,
    )
    return [
        {
            "epoch": epoch,
            "frozen_units": frozen_units,
            "frozen": layout.frozen,
            "pipe_len": layout.pipe_len,
            "replicas": layout.replicas,
            "boundaries": list(layout.boundaries),
            "microbatches": layout.microbatches,
        }
        for epoch, (frozen_units, layout) in enumerate(sequence)
    ]
