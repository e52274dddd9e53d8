"""Elastic training on torch.distributed: the thin orchestrator that composes the primitives.

No algorithm lives here: freeze decisions come from :mod:`elastic_pipe.freeze`, partitions and compression from
:mod:`elastic_pipe.partition`, schedules from :mod:`elastic_pipe.schedule`, process groups from
:mod:`elastic_pipe.groups`, the transition message from :mod:`elastic_pipe.protocol`, data sharding from
:mod:`elastic_pipe.data`, the models from :mod:`elastic_pipe.models`. This package wires them into one training
loop per rank (:class:`ElasticTrainer`), moves state between ranks at transitions, checkpoints, logs, and launches
processes with torchrun's elastic agent. See docs/training.md.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.components import Components, components_from_config, resolve
from elastic_pipe.orchestrator.config import (
    CheckpointSection,
    DataSection,
    FreezeSection,
    LaunchSection,
    LogSection,
    ModelSection,
    PipelineSection,
    TrainConfig,
    TrainSection,
    config_from_tables,
    load_config,
)
from elastic_pipe.orchestrator.errors import ConfigError, OrchestratorError, WorkerFailedError
from elastic_pipe.orchestrator.launch import launch
from elastic_pipe.orchestrator.layout import (
    COMPRESSION_RULES,
    CompressionRule,
    Halving,
    KeepLength,
    MemoryFit,
    layout_sequence,
)
from elastic_pipe.orchestrator.persist import Checkpointer, fingerprint
from elastic_pipe.orchestrator.preflight import preflight
from elastic_pipe.orchestrator.report import (
    EpochMetrics,
    EventLog,
    RecordSink,
    RunResult,
    TensorBoardSink,
    TransitionEvent,
)
from elastic_pipe.orchestrator.state import RunState
from elastic_pipe.orchestrator.trainer import ElasticTrainer, candidate_pipe_lens
from elastic_pipe.orchestrator.transition import Transfer, held_sublayers, plan_transfers
from elastic_pipe.orchestrator.worker import run_rank

__all__ = [
    "COMPRESSION_RULES",
    "CheckpointSection",
    "Checkpointer",
    "Components",
    "CompressionRule",
    "ConfigError",
    "DataSection",
    "ElasticTrainer",
    "EpochMetrics",
    "EventLog",
    "FreezeSection",
    "Halving",
    "KeepLength",
    "LaunchSection",
    "LogSection",
    "MemoryFit",
    "ModelSection",
    "OrchestratorError",
    "PipelineSection",
    "RecordSink",
    "RunResult",
    "RunState",
    "TensorBoardSink",
    "TrainConfig",
    "TrainSection",
    "Transfer",
    "TransitionEvent",
    "WorkerFailedError",
    "candidate_pipe_lens",
    "components_from_config",
    "config_from_tables",
    "fingerprint",
    "held_sublayers",
    "launch",
    "layout_sequence",
    "load_config",
    "plan_transfers",
    "preflight",
    "resolve",
    "run_rank",
]
