"""Sharded checkpoints: each stage's rank writes its own weights and optimizer state, the main file holds the rest,
and a checkpoint loads into another layout and world size, checked shard by shard.

One 4-rank run (4 -> 2 -> 1 stages) writes a checkpoint inside epoch 0 (4 shards) and after every epoch; the
tests read its files, resume one of them on 2 processes, damage a shard, and export the weights from the shards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from elastic_pipe.testing import RankContext, run_distributed

MODEL = {"preset": "vit-tiny", "depth": 4, "dim": 32, "heads": 2, "mlp_dim": 64, "patch_size": 4}


def _config(directory: Path, overrides: dict[str, Any] | None = None) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": {"name": "vit", "options": MODEL},
        "data": {"eval_fraction": 0.8},
        "train": {"epochs": 3, "dtype": "float64", "global_batch": 64, "optimizer": "adamw", "lr": 0.005},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 2, 2: 3}}},
        "pipeline": {"microbatches": 2, "pipe_len": 4, "solver": "optimal", "cache": "off"},
        "launch": {"nproc_per_node": 4},
        "log": {"progress": False},
        "checkpoint": {"dir": str(directory), "steps": 2},
    }
    return config_from_tables(tables).override(overrides or {})


def _train(ctx: RankContext, directory: str) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer

    with ElasticTrainer(_config(Path(directory)), quiet=True) as trainer:
        result = trainer.fit()
        keys = trainer.ctx.sublayer_keys
    return {"result": result.to_dict(), "keys": keys}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("sharded") / "ckpt"
    results = run_distributed(_train, 4, str(directory), timeout=400)
    return directory, results[0]


def _load(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


@pytest.mark.distributed
@pytest.mark.slow  # one 4-rank run of 3 epochs
def test_each_stage_writes_only_its_own_weights_and_optimizer_state(run: tuple[Path, dict[str, Any]]) -> None:
    directory, first = run
    keys: list[list[str]] = first["keys"]
    # inside epoch 0 the layout had 4 stages with boundaries (0, 3, 5, 7, 10): four shards, one per stage
    name = "epoch-0000-step-000002"
    shards = sorted(p.name for p in directory.glob(f"{name}.stage-*.shard"))
    assert shards == [f"{name}.stage-{s:04d}.shard" for s in range(4)]
    main = _load(directory / f"{name}.pt")
    assert "model" not in main and set(main["optimizer"]) == {"param_groups"}  # nothing of any stage's tensors
    assert main["shards"]["files"] == shards
    bounds = (0, 3, 5, 7, 10)
    for s, shard in enumerate(shards):
        content = _load(directory / shard)
        mine = [k for j in range(bounds[s], bounds[s + 1]) for k in keys[j]]
        assert list(content["model"]) == mine  # its own stage's weights, nothing else
        params = {k for k in mine if not k.endswith("running_mean")}
        assert set(content["optimizer"]["state"]) <= params and content["optimizer"]["state"]
        assert all(main["shards"]["index"][k] == shard for k in mine)
        manifest = json.loads((directory / f"{name}.stage-{s:04d}.manifest.json").read_text())
        assert manifest["file"] == shard and len(manifest["sha256"]) == 64
    # after epoch 2 the layout had 1 stage of 4 replicas: one shard, holding the frozen prefix and the rest
    last = _load(directory / "epoch-0002.stage-0000.shard")
    assert list(last["model"]) == [k for ks in keys for k in ks]
    assert not (directory / "epoch-0002.stage-0001.shard").exists()


def _resume(ctx: RankContext, directory: str) -> dict[str, Any]:
    """Resume on this rank, compare what it loaded with the files, then train on (tensors stay in the rank: ones
    sent back through the result queue would not outlive it)."""
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.persist import load_weights

    config = _config(Path(directory), {"launch.nproc_per_node": 2, "pipeline.pipe_len": 2})
    with ElasticTrainer(config, quiet=True) as trainer:
        trainer.setup()
        assert trainer.resume()
        names = {id(p): n for n, p in trainer.ctx.model.named_parameters()}
        state = {names[id(p)]: s for p, s in trainer.optimizer.state.items()}
        layout = trainer.state.layout
        full = trainer.full_state_dict()
        expected, _ = load_weights(Path(directory) / "epoch-0001.pt")
        stage = trainer.stage.stage
        shard = _load(Path(directory) / f"epoch-0001.stage-{stage:04d}.shard")["optimizer"]["state"]
        out = {
            "layout": [layout.pipe_len, layout.replicas],
            # every weight back, bit for bit (assembled on rank 0)
            "weights": ctx.rank != 0
            or (list(full) == list(expected) and all(torch.equal(full[k], v) for k, v in expected.items())),
            # this rank took the optimizer state of its own stage from that stage's shard, and only that
            "names": sorted(state) == sorted(shard) and bool(shard),
            "values": all(
                torch.equal(state[n][k].cpu(), v) for n in shard for k, v in shard[n].items() if torch.is_tensor(v)
            ),
        }
        result = trainer.fit()
    out["epochs"] = [(e["pipe_len"], e["replicas"]) for e in result.epochs]
    return out


@pytest.mark.distributed
@pytest.mark.slow
def test_a_checkpoint_of_4_ranks_reshards_onto_2(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    directory, _ = run
    moved = tmp_path / "ckpt"
    moved.mkdir()
    for part in directory.glob("epoch-0001.*"):  # written on 4 ranks as 2 stages x 2 replicas
        shutil.copy(part, moved / part.name)
    meta = json.loads((directory / "latest.json").read_text())
    (moved / "latest.json").write_text(json.dumps({**meta, "file": "epoch-0001.pt", "epoch": 1}))
    results = run_distributed(_resume, 2, str(moved), timeout=300)
    assert [r["layout"] for r in results] == [[2, 1], [2, 1]]  # the saved layout, now with one replica
    assert [(r["weights"], r["names"], r["values"]) for r in results] == [(True, True, True)] * 2
    # and the run goes on from there: epoch 2 in the resumed layout, epoch 3 after the next decision
    assert results[0]["epochs"][-1] == (1, 2)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_damaged_shard_falls_back_to_the_previous_checkpoint(
    run: tuple[Path, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from elastic_pipe.orchestrator.persist.loads import load_latest

    directory, _ = run
    copy = tmp_path / "ckpt"
    shutil.copytree(directory, copy)
    meta = json.loads((copy / "latest.json").read_text())
    newest = meta["file"].removesuffix(".pt")
    shard = copy / f"{newest}.stage-0000.shard"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    found = load_latest(copy)
    assert found is not None
    state, manifest = found
    assert manifest["file"] != meta["file"]
    assert f"{newest}.stage-0000.shard" in caplog.text and "SHA-256" in caplog.text
    # the older checkpoint's tensors come from its own shards, read when asked for
    key = next(iter(state["model"]))
    assert torch.is_tensor(state["model"][key])


@pytest.mark.distributed
@pytest.mark.slow
def test_export_reads_the_shards(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from elastic_pipe.cli import main
    from elastic_pipe.orchestrator.persist import load_weights

    directory, _ = run
    out = tmp_path / "model.safetensors"
    assert main(["export", "--checkpoint", str(directory), "--out", str(out)]) == 0
    exported = load_file(out)
    meta = json.loads((directory / "latest.json").read_text())
    expected, _ = load_weights(directory / meta["file"])
    assert set(exported) == set(expected)
    assert all(torch.equal(exported[k], v) for k, v in expected.items())
