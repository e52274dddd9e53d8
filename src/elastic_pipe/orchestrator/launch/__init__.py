"""The processes of a run: the elastic agent that starts and restarts them, how they meet, how each joins
``torch.distributed`` and what a worker tells its launcher.

Modules: :mod:`.agent` (:func:`launch`: torchrun's elastic agent, a failed worker as one line), :mod:`.job` (the
run id, the rendezvous options, the workers' environment, decided before anything starts), :mod:`.rendezvous` (the
authenticated rendezvous backends, the loopback store), :mod:`.secret` (the job's rendezvous secret),
:mod:`.worker_store` (the workers' store, tagged under a key derived from the secret), :mod:`.worker_status` (a
worker's failure report and heartbeat, the launcher's watchdog), :mod:`.process_group` (joining the default group,
this process's device, warming up NCCL), :mod:`.faults` (fault injection for the restart tests). They are not API:
the rest of the orchestrator uses what this face exports.

Everything here stands below the trainer (its layers import this face to join the group and inject faults); what
builds and runs a trainer in each process stands above it: :mod:`elastic_pipe.orchestrator.worker` and the checks
before any process starts, :mod:`elastic_pipe.orchestrator.preflight`.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.launch.agent import launch
from elastic_pipe.orchestrator.launch.faults import maybe_fail
from elastic_pipe.orchestrator.launch.process_group import device_for, join_process_group, training_backend, warm_up

__all__ = ["device_for", "join_process_group", "launch", "maybe_fail", "training_backend", "warm_up"]
