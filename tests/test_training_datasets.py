"""Training on a user's map-style ``Dataset``: index subsets read through a ``DataLoader``, every sample once per
epoch (a short last step), the cache fill reading the dataset, bad items refused before the first step, and a
randomly flipped dataset trained by object and by import path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.data import ElasticSampler
from elastic_pipe.orchestrator.data import ElasticBatchSampler, epoch_plan, split_unit
from elastic_pipe.orchestrator.data.dataset_split import split_dataset
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.testing import RankContext, run_distributed, run_tasks

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

from plug_data import Broken, Digits  # noqa: E402

#: 300 digits: 240 training samples, 7 steps of 32 and a short one of 16 per epoch.
SAMPLES = 300


# ------------------------------------------------------------------------------------------------- pure units
def test_epoch_plan_trains_on_the_rest_in_one_short_step() -> None:
    plan = epoch_plan(240, 32, 2)
    assert (plan.steps, plan.full_steps, plan.last, plan.dropped, plan.used) == (8, 7, 16, 0, 240)
    assert plan.sizes() == [32] * 7 + [16] and plan.sizes(6) == [32, 16]
    assert [plan.steps_done(c) for c in (0, 32, 224, 240)] == [0, 1, 7, 8]
    # what cannot split over replicas x micro-batches is dropped, and counted
    assert epoch_plan(1438, 64, 8) == epoch_plan(1438, 64, 8, drop_last=False)
    assert (epoch_plan(1438, 64, 8).last, epoch_plan(1438, 64, 8).dropped) == (24, 6)
    assert (epoch_plan(1438, 64, 8, drop_last=True).steps, epoch_plan(1438, 64, 8, drop_last=True).dropped) == (22, 30)
    assert epoch_plan(256, 32, 2).steps == 8 and epoch_plan(256, 32, 2).dropped == 0


def test_split_unit_covers_every_reachable_layout() -> None:
    # 4 processes, K in (4, 2, 1) with 2 micro-batches while K > 1: R x M = 2, 4, 4 -> 4
    assert split_unit(4, (4, 2, 1), lambda k: 2 if k > 1 else 1) == 4
    assert split_unit(6, (3, 1), lambda k: 4 if k > 1 else 1) == 24  # 2 x 4 and 6 x 1


def test_the_batch_sampler_walks_a_copy_and_resumes_after_a_reshard() -> None:
    sampler = ElasticSampler(10, 1, 0, seed=3)
    plan = epoch_plan(10, 4, 2)  # 4, 4, 2
    first = list(ElasticBatchSampler(sampler, plan.sizes()))
    assert [len(b) for b in first] == [4, 4, 2] and sampler.consumed == 0  # iterating did not advance it
    seen = list(first[0])
    sampler.advance(4)
    halves = []
    for rank in (0, 1):  # one replica's step, then two replicas
        other = ElasticSampler(10, 1, 0, seed=3)
        other.load_state_dict(sampler.state_dict())
        other.reshard(2, rank)
        halves.append(list(ElasticBatchSampler(other, plan.sizes(1))))
    assert [len(b) for b in halves[0]] == [2, 1]
    seen += [i for h in halves for b in h for i in b]
    assert sorted(seen) == list(range(10))


def test_a_dataset_split_is_index_subsets_read_by_a_loader_with_workers() -> None:
    ds = Digits(SAMPLES)
    train, test = split_dataset(ds, 0.2, 0, torch.float64, workers=2)
    assert (len(train), len(test)) == (240, 60)
    assert sorted(train.sample_ids.tolist() + test.sample_ids.tolist()) == list(range(SAMPLES))
    lists = [[0, 5, 9], [3], [239, 1]]
    got = list(train.batches(lists, inputs=True, labels=True, device=torch.device("cpu")))
    for positions, (pos, x, y) in zip(lists, got, strict=True):
        assert pos.tolist() == positions and x is not None and y is not None and x.dtype == torch.float64
        ids = train.sample_ids[positions].tolist()
        torch.testing.assert_close(x, torch.stack([ds[i][0] for i in ids]).double())
        assert y.tolist() == [ds[i][1] for i in ids]
    labels_only = next(train.batches([[0, 1]], inputs=False, labels=True, device=torch.device("cpu")))
    assert labels_only.inputs is None and labels_only.labels is not None
    rows = torch.stack([ds[i][0] for i in train.sample_ids[3:5].tolist()]).double()
    torch.testing.assert_close(train.input_rows(3, 5), rows)


def test_a_bad_item_is_named_when_read() -> None:
    part = next(p for p in split_dataset(Broken(17, "shape"), 0.2, 0, torch.float32) if 17 in p.sample_ids.tolist())
    position = part.sample_ids.tolist().index(17)
    with pytest.raises(ConfigError, match=r"dataset item 17: input \(1, 8, 7\) torch.float32 differs from item 0's"):
        list(part.batches([[position]], inputs=True, labels=True, device=torch.device("cpu")))
    found = part.first_bad_item(0, 1)
    assert found is not None and found[0] == 17


# ------------------------------------------------------------------------------------------------- 2 processes
def _count_ids(ctx: RankContext) -> dict[str, Any]:
    """One epoch of the 240 training digits on 2 ranks: 3 steps as 2 stages x 1 replica (rank 0 reads inputs, rank
    1 labels), then a re-shard to 1 stage x 2 replicas and the rest; each rank returns the ids it read."""
    import torch.distributed as dist

    train, _ = split_dataset(Digits(SAMPLES), 0.2, 0, torch.float32)
    plan = epoch_plan(len(train), 32, split_unit(2, (2, 1), lambda k: 2 if k > 1 else 1))
    sampler = ElasticSampler(len(train), 1, 0, seed=0)
    stage0 = ctx.rank == 0
    read: list[int] = []
    batches = train.batches(
        ElasticBatchSampler(sampler, plan.sizes()), inputs=stage0, labels=not stage0, device=torch.device("cpu")
    )
    for i in range(3):
        pos, x, y = next(batches)
        if stage0:
            assert x is not None and y is None
            read += train.sample_ids[pos].tolist()
        sampler.advance(plan.size(i))
    sampler.reshard(2, ctx.rank)  # the transition: the loader is rebuilt from the sampler's position
    for pos, _, _ in train.batches(
        ElasticBatchSampler(sampler, plan.sizes(3)), inputs=True, labels=True, device=torch.device("cpu")
    ):
        read += train.sample_ids[pos].tolist()
    everything: list[Any] = [None, None]
    dist.all_gather_object(everything, read)
    return {"ids": everything, "train": train.sample_ids.tolist(), "plan": (plan.steps, plan.last, plan.dropped)}


@pytest.mark.distributed
def test_every_sample_is_read_once_per_epoch_across_a_reshard(two_ranks: list[dict[str, Any]]) -> None:
    result = two_ranks[0]["count_ids"]
    assert result["plan"] == (8, 16, 0)
    ids = [i for rank in result["ids"] for i in rank]
    assert sorted(ids) == sorted(result["train"])  # 240 ids, none twice, none missing, the short step included


def _config(**sections: dict[str, Any]) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
        "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", "compression": "halving"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
        "data": {"drop_last": False},  # the short last step: every training sample once per epoch
    }
    for name, body in sections.items():
        tables[name] = {**tables.get(name, {}), **body}
    return config_from_tables(tables)


def _equivalent_runs(ctx: RankContext) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer

    out = {}
    for name, pipeline in (("elastic", {"cache": "on"}), ("fixed", {"compression": "none", "cache": "off"})):
        with ElasticTrainer(_config(pipeline=pipeline), data=Digits(SAMPLES), quiet=True) as trainer:
            out[name] = trainer.fit().to_dict()
            out[name + "_kind"] = type(trainer.ctx.train_set).__name__
    return out


@pytest.mark.distributed
def test_a_dataset_trains_elastically_with_a_short_last_step_and_the_cache_filled_from_it(
    two_ranks: list[dict[str, Any]],
) -> None:
    results = [r["equivalent_runs"] for r in two_ranks]
    elastic, fixed = results[0]["elastic"], results[0]["fixed"]
    assert results[0]["elastic_kind"] == "DatasetSplit"  # read through the loader, not stacked
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in elastic["epochs"]] == [
        (0, 2, 1),
        (1, 2, 1),
        (2, 1, 2),
    ]
    assert [e["cache"] for e in elastic["epochs"]] == [False, True, True]  # filled from the dataset's inputs
    # every training sample once per epoch: 7 steps of 32 and one of 16
    assert [(e["steps"], e["samples"], e["dropped"]) for e in elastic["epochs"]] == [(8, 240, 0)] * 3
    assert len(elastic["losses"]) == 24
    assert elastic["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert elastic["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert results[1]["elastic"]["losses"] == elastic["losses"]


def _flipped(ctx: RankContext, workers: int) -> dict[str, Any]:
    from plug_data import flipped_digits

    from elastic_pipe.orchestrator import ElasticTrainer

    config = _config(pipeline={"cache": "off"}, data={"workers": workers, "drop_last": True})
    with ElasticTrainer(config, data=flipped_digits(SAMPLES), quiet=True) as trainer:
        result = trainer.fit().to_dict()
    # the cache on: random transforms are bypassed (recomputed), never refused
    with ElasticTrainer(_config(data={"drop_last": True}), data=flipped_digits(SAMPLES), quiet=True) as trainer:
        bypassed = trainer.fit().to_dict()
    return {"result": result, "bypassed": bypassed}


@pytest.mark.distributed
def test_a_randomly_flipped_dataset_trains_by_object(two_ranks: list[dict[str, Any]]) -> None:
    # the test harness's ranks are daemonic processes, which cannot start loader workers: the CLI test runs them
    results = [r["flipped"] for r in two_ranks]
    result = results[0]["result"]
    assert [(e["pipe_len"], e["replicas"]) for e in result["epochs"]] == [(2, 1), (2, 1), (1, 2)]
    assert [(e["steps"], e["samples"], e["dropped"]) for e in result["epochs"]] == [(7, 224, 16)] * 3  # drop_last
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert result["losses"][-1] != pytest.approx(result["losses"][0], rel=1e-3)
    bypassed = results[0]["bypassed"]
    assert [e["cache"] for e in bypassed["epochs"]] == [False] * 3 and bypassed["losses"] == result["losses"]


def _bad(ctx: RankContext, kind: str) -> str:
    from elastic_pipe.orchestrator import ElasticTrainer

    try:
        with ElasticTrainer(_config(pipeline={"cache": "off"}), data=Broken(201, kind), quiet=True) as trainer:
            trainer.fit()
    except ConfigError as exc:
        return str(exc)
    return ""


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("shape", r"dataset item 201: input (1, 8, 7)"),
        ("label", "dataset item 201: label 10 is out of range [0, 10)"),
        ("unreadable", "dataset item 201 cannot be read: FileNotFoundError: [Errno 2] No such file: '/data/201.png'"),
    ],
)
def test_a_bad_item_fails_every_rank_before_the_first_step(
    two_ranks: list[dict[str, Any]], kind: str, message: str
) -> None:
    assert [message in m for m in (r["bad:" + kind] for r in two_ranks)] == [True, True]


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    """Every 2-rank task above, one after the other in one job (each builds its own dataset and trainers; starting
    the ranks cost more than most of the tasks), the results by rank (the 6 jobs it replaces had 960 s together; the
    suite caps a job at 500 s, and the tasks take seconds)."""
    tasks: dict[str, tuple[Any, tuple[Any, ...]]] = {
        "count_ids": (_count_ids, ()),
        "equivalent_runs": (_equivalent_runs, ()),
        "flipped": (_flipped, (0,)),
        **{"bad:" + kind: (_bad, (kind,)) for kind in ("shape", "label", "unreadable")},
    }
    return run_distributed(run_tasks, 2, tasks, timeout=500)


CONFIG = """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32 }
[data]
dataset = "plug_data:flipped_digits"
options = { samples = 300 }
workers = 1
drop_last = false
[train]
epochs = 2
global_batch = 32
[freeze]
policy = "manual"
options = { schedule = { 1 = 2 } }
[pipeline]
pipe_len = 2
microbatches = 2
cache = "off"
[launch]
nproc_per_node = 2
backend = "gloo"
[log]
progress = false
"""


@pytest.mark.distributed
def test_a_dataset_by_import_path_trains_under_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "elastic_pipe", "train", "--config", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert [(e["pipe_len"], e["replicas"], e["steps"], e["samples"]) for e in doc["epochs"]] == [
        (2, 1, 8, 240),
        (1, 2, 8, 240),
    ]
