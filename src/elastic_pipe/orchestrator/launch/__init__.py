"""The processes of a run: the elastic agent that starts and restarts them, how they meet, how each joins
``torch.distributed``, what a worker tells its launcher, what a worker runs, and the checks before any of it starts.

Modules: :mod:`.agent` (:func:`launch`: torchrun's elastic agent, a failed worker as one line), :mod:`.job` (the
run id, the rendezvous options, the workers' environment, decided before anything starts), :mod:`.rendezvous` (the
authenticated rendezvous backends, the loopback store), :mod:`.secret` (the job's rendezvous secret),
:mod:`.worker_store` (the workers' store, tagged under a key derived from the secret), :mod:`.worker_status` (a
worker's failure report and heartbeat, the launcher's watchdog), :mod:`.process_group` (joining the default group,
this process's device, warming up NCCL), :mod:`.faults` (fault injection for the restart tests), :mod:`.preflight`
(the checks before any process starts) and :mod:`.worker` (what each process runs: ``run_rank``, ``entry``,
``main``). They are not API: the rest of the orchestrator uses what this face exports.

The trainer's own layers import this face (to join the group, to inject faults), so it holds only what stands
below the trainer. :mod:`.preflight` and :mod:`.worker` stand above it (they build and run a trainer) and are not
exported here: :mod:`elastic_pipe.orchestrator` exports ``preflight`` and ``run_rank``, and the CLI,
``python -m elastic_pipe.orchestrator`` and the embedded demo import the worker's entry points by their path.
"""

from __future__ import annotations

from elastic_pipe.orchestrator.launch.agent import launch
from elastic_pipe.orchestrator.launch.faults import maybe_fail
from elastic_pipe.orchestrator.launch.process_group import device_for, join_process_group, training_backend, warm_up

__all__ = ["device_for", "join_process_group", "launch", "maybe_fail", "training_backend", "warm_up"]
