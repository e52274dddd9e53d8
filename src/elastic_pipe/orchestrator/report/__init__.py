"""What a run reports, and the clocks it reads: the records (an epoch's metrics, a transition's event, the run's
result), the event log that writes them as JSON lines and hands them to its sinks (TensorBoard), the phase clocks
and the progress bar, and an epoch's losses (kept on the device, reduced, checked for a non-finite value).

Modules: :mod:`.records` (the record kinds, their lines, the phases), :mod:`.event_log` (where records go),
:mod:`.tensorboard` (the TensorBoard sink, its optional extra), :mod:`.clocks` (phase clocks, the progress bar),
:mod:`.losses` (an epoch's losses). They are not API: the rest of the orchestrator uses what this face exports.
An epoch's record made from what the step loop measured (:mod:`elastic_pipe.orchestrator.epoch_record`) stands
beside this package, not in it: it runs the evaluation and reads the stage, and this package imports no other part
of the orchestrator but its errors.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.report.clocks import PhaseClock, Progress, seconds_into
from elastic_pipe.orchestrator.report.event_log import EventLog, RecordSink
from elastic_pipe.orchestrator.report.losses import EpochLosses, check_finite_losses, step_loss
from elastic_pipe.orchestrator.report.records import PHASES, EpochMetrics, RunResult, TransitionEvent
from elastic_pipe.orchestrator.report.tensorboard import TensorBoardSink, tensorboard_missing

__all__ = [
    "PHASES",
    "EpochLosses",
    "EpochMetrics",
    "EventLog",
    "PhaseClock",
    "Progress",
    "RecordSink",
    "RunResult",
    "TensorBoardSink",
    "TransitionEvent",
    "check_finite_losses",
    "seconds_into",
    "step_loss",
    "tensorboard_missing",
]
