"""Pipeline schedules as data: an action IR, generators (GPipe, 1F1B, interleaved, zero-bubble), a validator,
an event-driven simulator, micro-batch tuning, Gantt charts and lowering to torch.distributed.pipelining.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.schedule.errors import MissingExtraError, ScheduleError
from elastic_pipe.schedule.generators import (
    GENERATORS,
    ScheduleGenerator,
    generate,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zb_h1,
)
from elastic_pipe.schedule.ir import Action, ActionKind, Schedule
from elastic_pipe.schedule.simulate import Cost, Simulation, peak_activations, simulate
from elastic_pipe.schedule.validate import check_structure, validate

__all__ = [
    "GENERATORS",
    "Action",
    "ActionKind",
    "Cost",
    "MissingExtraError",
    "Schedule",
    "ScheduleError",
    "ScheduleGenerator",
    "Simulation",
    "check_structure",
    "generate",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "peak_activations",
    "simulate",
    "validate",
    "zb_h1",
]
