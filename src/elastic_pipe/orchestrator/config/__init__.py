"""``TrainConfig``: the numbers and names of one elastic training run, sectioned exactly as its TOML file is.

Each TOML table is one frozen, validated section; every key is optional except ``[model] name``::

    [model]
    name = "vit"                    # a builder of elastic_pipe.models, or your own: "my_pkg.models:build"
    options = { preset = "digits-tiny" }

    [data]
    dataset = "digits"              # "digits", "mnist5k", or "my_pkg.data:train_set" (an import path)

    [train]
    epochs = 6
    global_batch = 64               # samples per optimizer step, whatever the number of replicas
    lr = 0.05

    [freeze]
    policy = "alpha"                # a name of elastic_pipe.freeze.POLICIES or "my_pkg.policies:Plateau"
    options = { alpha = 0.5 }

    [pipeline]
    pipe_len = 4                    # initial pipeline length K
    compression = "halving"         # "halving", "memory" or "none" (freeze only, no reshaping)

    [launch]
    nproc_per_node = 4

In Python the same shape: ``TrainConfig(model=ModelSection("vit"), train=TrainSection(epochs=3))``, or
:func:`config_from_tables` with the TOML's dictionary. :meth:`TrainConfig.override` applies ``"section.key"``
overrides (the CLI's ``--set``).

This subpackage holds only plain values: names and import paths are resolved into objects by
:func:`elastic_pipe.orchestrator.components.components_from_config`, the only reader of the registries.
Structural checks (positive counts, divisibility, known enum values) happen here, without importing torch.

Modules: :mod:`.run_config` (:class:`TrainConfig`, read and overridden), :mod:`.sections` (``[model]``, ``[data]``,
``[train]``, ``[freeze]``), :mod:`.system_sections` (``[pipeline]``, ``[launch]``, ``[checkpoint]``, ``[log]``),
:mod:`.values` (the allowed names, limits, defaults and key checks). The rest of the toolkit imports from here.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.config.run_config import TrainConfig, config_from_tables, load_config
from elastic_pipe.orchestrator.config.sections import DataSection, FreezeSection, ModelSection, TrainSection
from elastic_pipe.orchestrator.config.system_sections import (
    CheckpointSection,
    LaunchSection,
    LogSection,
    PipelineSection,
)
from elastic_pipe.orchestrator.config.values import DECIDE_AUTO, DEFAULT_POLICY, size_bytes

__all__ = [
    "DECIDE_AUTO",
    "DEFAULT_POLICY",
    "CheckpointSection",
    "DataSection",
    "FreezeSection",
    "LaunchSection",
    "LogSection",
    "ModelSection",
    "PipelineSection",
    "TrainConfig",
    "TrainSection",
    "config_from_tables",
    "load_config",
    "size_bytes",
]
