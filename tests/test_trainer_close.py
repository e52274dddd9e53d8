"""What a one-rank run leaves for the end (issue #41: the elastic arms' close cost 0.65-1.17 s on one GPU): no
collective on a training group of one rank (on NCCL each would get a communicator, created at set-up and destroyed
at the close), no loader started after the last evaluation, every loader worker gone after the close, and the close's
seconds per part in the result."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import tiny_vit

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

from plug_data import Digits

#: Every ``torch.distributed`` call that communicates over a group.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
)


def _groups_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The groups a call names (``batch_isend_irecv``: its operations' groups)."""
    if name == "batch_isend_irecv":
        return [op.group for op in args[0]]
    return [kwargs.get("group"), *args]


def test_a_one_rank_run_communicates_on_no_training_group_and_starts_no_loader_after_its_last_evaluation(
    monkeypatch: pytest.MonkeyPatch, one_rank_here: None
) -> None:
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    config = config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True, "workers": 1},
            "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},  # two transitions, the cache
            "pipeline": {"pipe_len": 1, "microbatches": 1},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )
    calls: list[tuple[str, Any]] = []
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def recording(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls.extend((_name, group) for group in _groups_of(_name, args, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(dist, name, recording)
    training: list[Any] = []
    built: list[int] = []

    def at_epoch_end(trainer: ElasticTrainer) -> None:
        groups = trainer.ctx.groups
        training[:] = [groups.pipeline_group(1), groups.dp_group(1)]
        built.append(trainer.ctx.train_set.loaders_built + trainer.ctx.eval_set.loaders_built)

    with ElasticTrainer(config, data=Digits(96), quiet=True) as trainer:
        result = trainer.fit(on_epoch_end=at_epoch_end)
        assert [t["frozen_units"] for t in result.transitions] == [1, 2]
        assert trainer.prefix.cache is not None
        workers = multiprocessing.active_children()
        assert workers  # the kept loaders' workers (this test's only child processes) are alive until the close
    assert any(name == "broadcast" for name, _ in calls)  # the recording sees the control group's messages
    # a pipeline of one stage sends nothing and one replica averages nothing: NCCL never makes a communicator for
    # these groups (none to create at set-up, none to destroy at the close)
    assert [name for name, group in calls if any(group is g for g in training)] == []
    # the close starts no loader: what was built by the last evaluation is all there is
    assert trainer.ctx.train_set.loaders_built + trainer.ctx.eval_set.loaders_built == built[-1]
    assert not any(p.is_alive() for p in workers)
    assert set(result.close_phases) == {"stage", "cache", "loaders", "log", "groups", "process_group"}
    assert all(seconds >= 0 for seconds in result.close_phases.values())
