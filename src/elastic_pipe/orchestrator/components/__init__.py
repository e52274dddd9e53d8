"""The parts a trainer composes, and the one function that turns a config of names into them.

:class:`Components` holds built objects: the model, the data, the freeze policy, the partition solver, the
compression rule, the schedule kind, the optimizer factory and the loss. :class:`~elastic_pipe.orchestrator.trainer.
ElasticTrainer` takes them directly; :func:`components_from_config` builds them from a :class:`TrainConfig` and is
the only reader of the registries (``freeze.POLICIES``, ``partition.SOLVERS``, the model builders, the datasets).

Wherever a registry name is accepted, so is an import path ``"package.module:attribute"``: it is imported in the
process that resolves it, so under ``elastic-pipe train`` (spawned workers) and torchrun alike every worker finds the
user's own policy, model or dataset without anything being registered.

Modules: :mod:`.lookup` (a registry name or an import path to its object), :mod:`.registry` (the models and
datasets a config may name), :mod:`.policy` (the config's freeze
policy, and a user's made whole), :mod:`.steps` (a run's step counts and decision rhythm), :mod:`.compose`
(:class:`Components` and :func:`components_from_config`). The rest of the toolkit imports from here.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.components.compose import (
    Components,
    Overrides,
    check_runnable_schedule,
    components_from_config,
)
from elastic_pipe.orchestrator.components.lookup import KEYS, resolve
from elastic_pipe.orchestrator.components.policy import adapt_policy, make_policy
from elastic_pipe.orchestrator.components.registry import (
    DATASETS,
    MODEL_BUILDERS,
    build_model,
    load_eval_samples,
    load_samples,
)
from elastic_pipe.orchestrator.components.steps import decision_interval, epoch_steps, run_steps, with_decisions

__all__ = [
    "DATASETS",
    "KEYS",
    "MODEL_BUILDERS",
    "Components",
    "Overrides",
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
