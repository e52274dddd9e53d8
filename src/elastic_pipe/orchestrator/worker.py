"""What each process runs: join the process group, build the model and data, train, checkpoint, report.

``python -m elastic_pipe.orchestrator --config FILE.toml`` is the script torchrun starts on every rank
(:mod:`elastic_pipe.orchestrator.launch` starts :func:`entry` for ``elastic-pipe train``); :func:`run_rank` is the
same thing as a function, for a program that already runs under torchrun or
:func:`elastic_pipe.testing.run_distributed`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.groups import GroupManager
from elastic_pipe.orchestrator.checkpoint import Checkpointer
from elastic_pipe.orchestrator.config import TrainConfig, load_config
from elastic_pipe.orchestrator.metrics import EventLog
from elastic_pipe.orchestrator.preflight import preflight
from elastic_pipe.orchestrator.runtime import ElasticRun, RunResult, candidate_pipe_lens
from elastic_pipe.orchestrator.workload import Samples, build_model, cross_entropy, load_samples, split_samples

__all__ = ["device_for", "join_process_group", "main", "run_rank", "training_backend", "warm_up"]

log = logging.getLogger(__name__)


def training_backend(config: TrainConfig) -> str:
    """The backend of the training groups: NCCL when asked for or when CUDA is there under "auto", else gloo."""
    if config.backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return config.backend


def device_for(config: TrainConfig) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` with NCCL, else the CPU."""
    if training_backend(config) == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def join_process_group(config: TrainConfig) -> bool:
    """Join the default group from the torchrun environment unless a caller did; returns whether we did."""
    if dist.is_initialized():
        return False
    backend = training_backend(config)
    # CPU tensors (statistics, byte payloads) may meet the default group too, so NCCL jobs pair it with gloo.
    spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    timeout = datetime.timedelta(seconds=config.timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # Under the elastic agent every restart attempt shares the agent's store. Without a per-attempt prefix a
        # restarted worker can read the dead attempt's addresses and fail to connect, so the prefix is added here.
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        agent_store = dist.TCPStore(  # type: ignore[attr-defined]
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
        )
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"elastic_pipe/attempt_{attempt}", agent_store)  # type: ignore[attr-defined]
        dist.init_process_group(spec, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(spec, timeout=timeout)
    return True


def warm_up(groups: GroupManager, device: torch.device) -> None:
    """One tiny all-reduce on every training group this rank belongs to (a collective).

    NCCL creates a communicator on a group's first collective, which can take a second; doing it here keeps that
    cost out of the first step and out of every transition. Every rank walks the groups in the same global order
    (by pipeline length, pipeline group before data-parallel group), which cannot deadlock.
    """
    for k in groups.pipe_lens:
        for group in (groups.pipeline_group(k), groups.dp_group(k)):
            dist.all_reduce(torch.zeros(1, device=device), group=group)


def run_rank(
    config: TrainConfig,
    *,
    model: nn.Module | None = None,
    samples: Samples | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy,
    quiet: bool = False,
) -> RunResult:
    """Train on this rank (a collective: every rank of the job calls it with the same arguments).

    Args:
        config: the run (validated; run :func:`elastic_pipe.orchestrator.preflight` first for a clear error
            before any process starts).
        model: a :class:`~elastic_pipe.models.SubLayerModel` seeded identically on every rank; default: the
            config's model.
        samples: the dataset (inputs, labels, sample_ids); default: the config's dataset.
        loss_fn: ``loss_fn(output, target)``, mean over the micro-batch.
        quiet: no human lines on stderr (records still go to the log files).

    Returns:
        The run's result (the same numbers on every rank).
    """
    owns_group = join_process_group(config)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        device = device_for(config)
        dtype = getattr(torch, config.dtype)
        model = model if model is not None else build_model(config)
        samples = samples if samples is not None else load_samples(config)
        train_set, eval_set = split_samples(samples, config.eval_fraction, config.seed, dtype)
        groups = GroupManager(
            world,
            rank,
            candidate_pipe_lens(config),
            backend=training_backend(config),
            gpus_per_node=config.nproc_per_node if config.nnodes > 1 else None,
            timeout=config.timeout,
        )
        groups.build()
        try:
            warm_up(groups, device)
            events = None
            if rank == 0:
                path = os.path.join(config.log_dir, "events.jsonl") if config.log_dir else None
                events = EventLog(path, None if quiet else sys.stderr)
            run = ElasticRun(config, model, train_set, eval_set, groups, device=device, log=events, loss_fn=loss_fn)
            try:
                checkpointer = Checkpointer(config) if config.checkpoint_dir else None
                if checkpointer is not None and config.resume == "auto":
                    checkpointer.resume(run)
                if checkpointer is None:
                    return run.fit()
                return run.fit(on_epoch_end=checkpointer.maybe_save, on_step=checkpointer.maybe_save_step)
            finally:
                run.close()
        finally:
            groups.destroy()
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()


def entry(config_dict: dict[str, Any]) -> dict[str, Any]:
    """A picklable entry point for ``elastic_launch``: run this rank, return the result as plain data."""
    return run_rank(TrainConfig(**config_dict)).to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m elastic_pipe.orchestrator --config FILE.toml [--result FILE.json]``."""
    parser = argparse.ArgumentParser(prog="python -m elastic_pipe.orchestrator")
    parser.add_argument("--config", required=True, help="TOML training configuration")
    parser.add_argument("--result", help="rank 0 writes the run's result here as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    config = load_config(args.config)
    preflight(config)
    result = run_rank(config)
    if args.result and int(os.environ.get("RANK", "0")) == 0:
        with open(args.result, "w", encoding="utf-8") as f:
            json.dump(result.to_dict(), f)
    return 0
