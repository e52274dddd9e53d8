"""Start the processes: torchrun's elastic launcher underneath ``elastic-pipe train`` and ``elastic-pipe demo``.

One agent per node starts ``nproc_per_node`` workers, joins the other nodes' agents through a c10d rendezvous and
restarts the whole group (up to ``max_restarts`` times) when a worker fails; the workers then resume from the last
checkpoint. A single-node run uses a standalone rendezvous on a free loopback port.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import OrchestratorError

__all__ = ["launch"]

#: Seconds the agents wait for each other at the rendezvous.
RDZV_TIMEOUT_S = 120


def launch(
    config: TrainConfig, entrypoint: Callable[..., Any], *args: Any, run_id: str | None = None
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` on this node's ``nproc_per_node`` ranks under the elastic agent.

    Args:
        config: gives ``nnodes``, ``nproc_per_node``, ``max_restarts`` and ``rdzv_endpoint``.
        entrypoint: a module-level function (workers import it by name).
        *args: picklable arguments.
        run_id: the job id shared by every node's agent (default: a fresh one, fine for one node).

    Returns:
        Each local rank's return value.

    Raises:
        OrchestratorError: a worker failed after all restarts (the first failure's message included).
    """
    endpoint = config.launch.rdzv_endpoint or "localhost:0"
    if config.launch.nnodes > 1 and not config.launch.rdzv_endpoint:
        raise OrchestratorError("a multi-node run needs launch.rdzv_endpoint = 'host:port' (the same on every node)")
    if config.launch.nnodes > 1 and run_id is None:
        run_id = "elastic-pipe"
    launch_config = LaunchConfig(
        min_nodes=config.launch.nnodes,
        max_nodes=config.launch.nnodes,
        nproc_per_node=config.launch.nproc_per_node,
        run_id=run_id or str(uuid.uuid4()),
        rdzv_endpoint=endpoint,
        rdzv_backend="c10d",
        rdzv_configs={"timeout": RDZV_TIMEOUT_S},
        max_restarts=config.launch.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
    )
    try:
        result: dict[int, Any] = elastic_launch(launch_config, entrypoint)(*args)
    except ChildFailedError as exc:
        first = next(iter(exc.failures.values()), None)
        detail = first.message if first is not None else str(exc)
        raise OrchestratorError(f"training failed after {config.launch.max_restarts} restart(s): {detail}") from exc
    return result
