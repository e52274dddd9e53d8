"""What a job is, decided before anything starts: its run id, how its agents meet, what its workers inherit.

Each is decided by a pure function the tests check (:func:`worker_environ` applies the environment for a launch):

* the run id (:func:`resolve_run_id`): a fresh random one per single-node job; a multi-node job must be given the
  same id on every node;
* loopback only for a single node (:func:`rendezvous_options`): the rendezvous store and the workers' store listen
  on 127.0.0.1 (torch's c10d stores listen on every interface, so the stores are built on sockets bound here);
  both rendezvous are authenticated (:mod:`elastic_pipe.orchestrator.launch.rendezvous`);
* one OpenMP thread per worker when several share the node and the user set none, and NCCL's asynchronous error
  handling on (:func:`worker_environment`), as torchrun does: N workers with all cores each only contend, and a
  collective that fails or times out on one GPU tears its process down instead of leaving the others hanging;
* a first line on stderr saying what starts (:func:`startup_line`), before the seconds the workers take to import.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from elastic_pipe.orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = [
    "AUTH_C10D_BACKEND",
    "LOOPBACK",
    "LOOPBACK_BACKEND",
    "NCCL_ERROR_HANDLING_ENV",
    "RUN_ID_ENV",
    "RendezvousOptions",
    "nccl_error_handling",
    "rendezvous_options",
    "resolve_run_id",
    "startup_line",
    "worker_environ",
    "worker_environment",
]

#: A single-node job's stores listen here only: no other machine can join or read it.
LOOPBACK = "127.0.0.1"
#: The rendezvous backend a single-node job uses (:mod:`.rendezvous` registers it): authenticated, on stores bound
#: to :data:`LOOPBACK`.
LOOPBACK_BACKEND = "elastic-pipe-loopback"
#: The rendezvous backend a job at a given endpoint uses (:mod:`.rendezvous` registers it): authenticated, on
#: torch's c10d TCPStore.
AUTH_C10D_BACKEND = "elastic-pipe-c10d"
#: Seconds the agents wait for each other at the rendezvous.
RDZV_TIMEOUT_S = 120
#: The environment variable that may carry the job's shared run id (``--run-id`` and ``[launch] run_id`` win).
RUN_ID_ENV = "ELASTIC_PIPE_RUN_ID"
#: How ProcessGroupNCCL's watchdog reacts to a failed or timed-out collective. torch's values: 0 nothing, 1 abort the
#: communicator and tear the process down, 2 abort the communicator only, 3 tear the process down without aborting
#: it (torch's own default). torchrun's agent sets 1 for its workers; so do we, for every worker and every process
#: that joins the group itself.
NCCL_ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
#: Abort the NCCL communicator, then tear the process down (see :data:`NCCL_ERROR_HANDLING_ENV`).
NCCL_TEAR_DOWN = "1"


def resolve_run_id(nnodes: int, run_id: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The job's run id: the one given (argument, then :data:`RUN_ID_ENV`), else a fresh random one for one node.

    Args:
        nnodes: number of nodes of the job.
        run_id: the id the user gave (``--run-id`` or ``[launch] run_id``), if any.
        environ: the environment to read :data:`RUN_ID_ENV` from (default ``os.environ``).

    Returns:
        The id every agent of the job uses; a fresh ``uuid4().hex`` for a single node without one.

    Raises:
        ConfigError: a multi-node job without a given id (each node would draw its own and never meet the others),
            or an empty or blank id.
    """
    env = os.environ if environ is None else environ
    given = run_id if run_id is not None else env.get(RUN_ID_ENV)
    if given is not None:
        if not given.strip():
            raise ConfigError(f"the run id must not be empty, got {given!r}")
        return given
    if nnodes > 1:
        raise ConfigError(
            f"a multi-node run ({nnodes} nodes) needs the same secret run id on every node: pass --run-id ID, set "
            f"[launch] run_id or the environment variable {RUN_ID_ENV} (e.g. from `python -c 'import uuid; "
            "print(uuid.uuid4().hex)'`)"
        )
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class RendezvousOptions:
    """How this node's agent meets the others (the rendezvous part of torch's ``LaunchConfig``).

    Attributes:
        backend: the rendezvous backend's registered name.
        endpoint: ``host:port`` of the rendezvous store.
        configs: extra backend options (``timeout``, ``is_host``).
        local_addr: the address this node's workers are told to reach the workers' store at (``None``: its fqdn).
    """

    backend: str
    endpoint: str
    configs: dict[str, object] = field(default_factory=dict)
    local_addr: str | None = None


def rendezvous_options(nnodes: int, rdzv_endpoint: str) -> RendezvousOptions:
    """The rendezvous of a job: loopback only for one node, the given shared endpoint for several.

    Both are authenticated (:class:`~elastic_pipe.orchestrator.launch.rendezvous.AuthenticatedBackend`).

    Raises:
        ConfigError: a multi-node job without an endpoint.
    """
    if nnodes > 1:
        if not rdzv_endpoint:
            raise ConfigError(
                f"a multi-node run ({nnodes} nodes) needs launch.rdzv_endpoint = 'host:port' (the same on every "
                "node), or --rdzv-endpoint"
            )
        return RendezvousOptions(AUTH_C10D_BACKEND, rdzv_endpoint, {"timeout": RDZV_TIMEOUT_S})
    if rdzv_endpoint:  # one node at a user-chosen endpoint: c10d as asked, it hosts the store itself
        return RendezvousOptions(AUTH_C10D_BACKEND, rdzv_endpoint, {"timeout": RDZV_TIMEOUT_S, "is_host": True})
    return RendezvousOptions(
        LOOPBACK_BACKEND, f"{LOOPBACK}:0", {"timeout": RDZV_TIMEOUT_S, "is_host": True}, local_addr=LOOPBACK
    )


def nccl_error_handling(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{TORCH_NCCL_ASYNC_ERROR_HANDLING: "1"}`` unless the user set it (see :data:`NCCL_ERROR_HANDLING_ENV`).

    ProcessGroupNCCL reads it when a group is created, so it must be in the environment before
    ``init_process_group``.
    """
    env = os.environ if environ is None else environ
    return {} if NCCL_ERROR_HANDLING_ENV in env else {NCCL_ERROR_HANDLING_ENV: NCCL_TEAR_DOWN}


def worker_environment(nproc_per_node: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to the environment the workers inherit (torchrun's rules).

    ``OMP_NUM_THREADS=1`` when several workers share the node and the user did not set it: torch sizes its
    intra-op thread pool from it at import, so each worker gets one thread instead of one per core. NCCL's
    asynchronous error handling on unless the user chose (:func:`nccl_error_handling`).
    """
    env = os.environ if environ is None else environ
    updates = nccl_error_handling(env)
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
        updates["OMP_NUM_THREADS"] = "1"
    return updates


@contextlib.contextmanager
def worker_environ(updates: Mapping[str, str]) -> Iterator[None]:
    """Set ``updates`` in ``os.environ`` (which spawned workers inherit) and restore the previous values after."""
    saved = {key: os.environ.get(key) for key in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def startup_line(config: TrainConfig, options: RendezvousOptions) -> str:
    """The first line a launch prints on stderr (before the workers spend seconds importing torch)."""
    n, nnodes, world = config.launch.nproc_per_node, config.launch.nnodes, config.world_size
    where = (
        f"rendezvous on {LOOPBACK} only"
        if options.backend == LOOPBACK_BACKEND
        else f"rendezvous at {options.endpoint} with {nnodes - 1} other node{'s' if nnodes > 2 else ''}"
        if nnodes > 1
        else f"rendezvous at {options.endpoint}"
    )
    return f"elastic-pipe: starting {n} worker{'s' if n != 1 else ''} on this node (world size {world}), {where} ..."
