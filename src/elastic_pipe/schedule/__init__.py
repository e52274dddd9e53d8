"""Pipeline schedules as data: an action IR, generators (GPipe, 1F1B, interleaved, zero-bubble) and what each
accepts (``refusal``, ``accepts``), a validator, an event-driven simulator, micro-batch tuning, Gantt charts and
lowering to torch.distributed.pipelining.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.schedule.errors import MissingExtraError, ScheduleError, ScheduleTypeError
from elastic_pipe.schedule.gantt import KIND_COLOURS, gantt
from elastic_pipe.schedule.generators import (
    GENERATORS,
    MAX_AUTO_VIRTUAL,
    ScheduleGenerator,
    accepts,
    generate,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    refusal,
    zb_h1,
)
from elastic_pipe.schedule.ir import MAX_CHUNKS, Action, ActionKind, Schedule
from elastic_pipe.schedule.simulate import Cost, Simulation, peak_activations, simulate
from elastic_pipe.schedule.torch_exec import torch_actions, torch_schedule
from elastic_pipe.schedule.tuning import (
    EAGER_HOST_SECONDS_PER_BLOCK,
    PUBLISHED_SEARCH_FACTORS,
    LinearCost,
    MicrobatchChoice,
    MicrobatchCost,
    StageTimes,
    TuningRow,
    tune_microbatches,
)
from elastic_pipe.schedule.validate import check_structure, validate

__all__ = [
    "EAGER_HOST_SECONDS_PER_BLOCK",
    "GENERATORS",
    "KIND_COLOURS",
    "MAX_AUTO_VIRTUAL",
    "MAX_CHUNKS",
    "PUBLISHED_SEARCH_FACTORS",
    "Action",
    "ActionKind",
    "Cost",
    "LinearCost",
    "MicrobatchChoice",
    "MicrobatchCost",
    "MissingExtraError",
    "Schedule",
    "ScheduleError",
    "ScheduleGenerator",
    "ScheduleTypeError",
    "Simulation",
    "StageTimes",
    "TuningRow",
    "accepts",
    "check_structure",
    "gantt",
    "generate",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "peak_activations",
    "refusal",
    "simulate",
    "torch_actions",
    "torch_schedule",
    "tune_microbatches",
    "validate",
    "zb_h1",
]
