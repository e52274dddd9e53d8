"""Joining torch.distributed: the backend, this process's device, the default group, warming up NCCL.

Used by :class:`~elastic_pipe.orchestrator.trainer.ElasticTrainer`; a program that already runs under torchrun or
:func:`elastic_pipe.testing.run_distributed` may join the group itself first (the trainer then leaves it alone).
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.launch.job import nccl_error_handling
from elastic_pipe.orchestrator.launch.worker_store import STORE_KEY_ENV, authenticated_store

if TYPE_CHECKING:
    from elastic_pipe.groups import GroupManager
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["choose_backend", "device_for", "join_process_group", "local_ranks", "training_backend", "warm_up"]

log = logging.getLogger(__name__)


def choose_backend(requested: str, cuda_devices: int, local_ranks: int) -> tuple[str, str]:
    """The training backend for ``requested`` ("auto", "gloo" or "nccl") on a node, and the reason for it.

    NCCL needs a device of its own for every local rank (two ranks on one GPU fail inside NCCL, or serialise), so
    "auto" picks it only when the node has at least as many CUDA devices as local ranks, and gloo on the CPU
    otherwise.

    Args:
        requested: ``[launch] backend``.
        cuda_devices: CUDA devices this node sees (``torch.cuda.device_count()``).
        local_ranks: processes on this node (``LOCAL_WORLD_SIZE``, ``[launch] nproc_per_node``).

    Returns:
        ``(backend, reason)``.

    Raises:
        ConfigError: "nccl" with fewer CUDA devices than local ranks.
    """
    enough = cuda_devices >= local_ranks
    if requested == "nccl" and not enough:
        raise ConfigError(
            f"backend 'nccl' needs a CUDA device per local rank: {local_ranks} ranks, {cuda_devices} CUDA "
            "devices; use backend = 'gloo' or 'auto', or fewer processes per node"
        )
    if requested != "auto":
        return requested, f"backend {requested!r} as configured"
    if enough and cuda_devices:
        return "nccl", f"{cuda_devices} CUDA devices for {local_ranks} local ranks"
    if not cuda_devices:
        return "gloo", "no CUDA device: gloo on the CPU"
    return "gloo", f"{local_ranks} local ranks but {cuda_devices} CUDA devices: gloo on the CPU"


def local_ranks(config: TrainConfig) -> int:
    """Processes on this node: torchrun's ``LOCAL_WORLD_SIZE``, else ``[launch] nproc_per_node``."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", config.launch.nproc_per_node))


def training_backend(config: TrainConfig) -> str:
    """The backend of the training groups (:func:`choose_backend` with this node's devices and ranks)."""
    return choose_backend(config.launch.backend, torch.cuda.device_count(), local_ranks(config))[0]


def device_for(config: TrainConfig) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` with NCCL, else the CPU."""
    if training_backend(config) == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def join_process_group(config: TrainConfig) -> bool:
    """Join the default group from the torchrun environment unless a caller did; returns whether we did.

    With NCCL, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` is set first unless the user set it
    (:func:`~elastic_pipe.orchestrator.launch.job.nccl_error_handling`), so a process started without torchrun's
    agent handles NCCL errors as one started by it.
    """
    if dist.is_initialized():
        return False
    backend, reason = choose_backend(config.launch.backend, torch.cuda.device_count(), local_ranks(config))
    if config.launch.backend == "auto" and backend == "gloo" and torch.cuda.device_count():
        log.warning("backend 'auto' chose gloo: %s", reason)
    else:
        log.info("training backend %s: %s", backend, reason)
    # CPU tensors (statistics, byte payloads) may meet the default group too, so NCCL jobs pair it with gloo.
    spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    if backend == "nccl":  # a failed or timed-out collective tears this process down, as under torchrun
        os.environ.update(nccl_error_handling())
    timeout = datetime.timedelta(seconds=config.launch.timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # Under the elastic agent every restart attempt shares the agent's store. Without a per-attempt prefix a
        # restarted worker can read the dead attempt's addresses and fail to connect, so the prefix is added here.
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        agent_store = TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
        )
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # The launcher hands its workers a key to tag every value with (worker_store.authenticated_store): another
        # process that reaches the store cannot feed them forged peer addresses.
        key = os.environ.get(STORE_KEY_ENV)
        shared = agent_store if not key else authenticated_store(agent_store, bytes.fromhex(key))
        store = PrefixStore(f"elastic_pipe/attempt_{attempt}", shared)
        dist.init_process_group(spec, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(spec, timeout=timeout)
    return True


def warm_up(groups: GroupManager, device: torch.device) -> None:
    """One tiny all-reduce on every training group this rank belongs to (a collective).

    NCCL creates a communicator on a group's first collective, which can take a second; doing it here keeps that
    cost out of the first step and out of every transition. Every rank walks the groups in the same global order
    (by pipeline length, pipeline group before data-parallel group), which cannot deadlock.

    A group of one rank is left alone: no step, evaluation, probe or transition runs a collective on it (a pipeline
    of one stage sends nothing, one replica averages nothing), so it never gets a communicator, which would cost
    its creation here and its destruction when the trainer closes (on one GPU both groups are such; issue #41).
    """
    for k in groups.pipe_lens:
        for group in (groups.pipeline_group(k), groups.dp_group(k)):
            if dist.get_world_size(group) > 1:
                dist.all_reduce(torch.zeros(1, device=device), group=group)
