"""``ElasticTrainer.full_state_dict`` and ``elastic-pipe export``: a trained model comes out whole and loads back."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.cli import main
from elastic_pipe.testing import RankContext, run_distributed

SAMPLES = 320


def _tables(ckpt: Path) -> dict[str, Any]:
    return {
        "model": tiny_vit.model_table(),
        "train": {"epochs": 1, "global_batch": 32, "lr": 0.05},
        "freeze": {"policy": "never", "options": {}},
        "pipeline": {"microbatches": 2, "pipe_len": 2, "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
        "checkpoint": {"dir": str(ckpt)},
    }


def _inputs() -> torch.Tensor:
    from elastic_pipe.data import load_digits

    return load_digits().inputs[:16]


def _train(ctx: RankContext, tables: dict[str, Any]) -> bytes:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.workload import Split

    d = load_digits()
    data = Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])
    with ElasticTrainer(config_from_tables(tables), data=data, quiet=True) as trainer:
        trainer.fit()
        full = trainer.full_state_dict()
    assert bool(full) == (ctx.rank == 0)
    out = io.BytesIO()
    torch.save(full, out)  # tensors in shared memory would not outlive the rank
    return out.getvalue()


@pytest.mark.distributed
def test_train_export_load_gives_the_same_logits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.components import build_model

    tables = _tables(tmp_path / "ckpt")
    full: dict[str, torch.Tensor] = torch.load(
        io.BytesIO(run_distributed(_train, 2, tables, timeout=180)[0]), weights_only=True
    )
    out = tmp_path / "model.safetensors"
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["epoch"], doc["tensors"], doc["out"]) == (1, len(full), str(out))

    config = config_from_tables(tables)
    exported, gathered, untrained = build_model(config), build_model(config), build_model(config)
    exported.load_state_dict(load_file(out))
    gathered.load_state_dict(full)
    x = _inputs()
    for model in (exported, gathered, untrained):
        model.eval()
    with torch.no_grad():
        logits = exported(x)
        assert torch.equal(logits, gathered(x))  # the checkpoint's weights are the trained model's, bit for bit
        assert not torch.allclose(logits, untrained(x))  # and training changed them


def test_export_handles_tied_tensors_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    shared = torch.arange(6.0).reshape(2, 3)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": {"embed.weight": shared, "head.weight": shared, "bias": shared[0]}}, ckpt / "epoch-0001.pt")
    (ckpt / "latest.json").write_text(json.dumps({"file": "epoch-0001.pt"}))
    out = tmp_path / "m.safetensors"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("wrote 3 tensors (15 values, ")
    loaded = load_file(out)
    assert torch.equal(loaded["head.weight"], shared) and torch.equal(loaded["bias"], shared[0])

    (tmp_path / "garbage.pt").write_text("not a checkpoint")
    for argv, message in [
        (["--checkpoint", str(tmp_path / "nope")], "no such file or directory"),
        (["--checkpoint", str(tmp_path)], "no checkpoint there (no latest.json)"),
        (["--checkpoint", str(tmp_path / "garbage.pt")], "cannot read checkpoint"),
        (["--checkpoint", str(out)], "holds no model weights"),
    ]:
        assert main(["export", *argv, "--out", str(tmp_path / "x.safetensors")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    torch.save({"run": {}}, tmp_path / "empty.pt")
    assert main(["export", "--checkpoint", str(tmp_path / "empty.pt"), "--out", str(out)]) == 2
    assert "holds no model weights" in capsys.readouterr().err
