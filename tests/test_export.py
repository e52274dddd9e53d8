"""``ElasticTrainer.full_state_dict`` and ``elastic-pipe export``: a trained model comes out whole and loads back."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
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
    from elastic_pipe.orchestrator.data import Split

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


def _train_and_score(ctx: RankContext, tables: dict[str, Any]) -> bytes:
    """Train, then on rank 0: the evaluation split as the trainer holds it and the trained model's logits on it."""
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    data = Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])  # raw: the trainer standardises
    config = config_from_tables(tables)
    with ElasticTrainer(config, data=data, quiet=True) as trainer:
        result = trainer.fit()
        full = trainer.full_state_dict()
        held = trainer.ctx.eval_set
    out = io.BytesIO()
    if ctx.rank == 0:
        model = build_model(config)
        model.load_state_dict(full)
        with torch.no_grad():
            logits = model.eval()(held.inputs)
        doc = {"ids": held.sample_ids, "inputs": held.inputs, "logits": logits, "accuracy": result.final_accuracy}
        torch.save(doc, out)
    return out.getvalue()


#: A fresh interpreter: load the export, prepare the raw digits it is given by id, save what the model predicts.
_FRESH = """
import sys, torch
import elastic_pipe
from elastic_pipe.data import load_digits

model, preprocess = elastic_pipe.load_exported(sys.argv[1])
ids = torch.load(sys.argv[2], weights_only=True)
raw = load_digits().inputs[ids]
x = preprocess(raw)
with torch.no_grad():
    doc = {"inputs": x, "logits": model(x), "raw_logits": model(raw), "kind": preprocess.spec["kind"]}
torch.save(doc, sys.argv[3])
"""


@pytest.mark.distributed
def test_exported_model_predicts_on_raw_inputs_in_a_fresh_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import subprocess
    import sys

    from elastic_pipe.data import load_digits

    tables = _tables(tmp_path / "ckpt")
    tables["train"]["epochs"] = 2
    trained = torch.load(io.BytesIO(run_distributed(_train_and_score, 2, tables, timeout=180)[0]), weights_only=True)
    out = tmp_path / "model.safetensors"
    assert main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    assert "preprocess: standardize" in capsys.readouterr().out
    torch.save(trained["ids"], tmp_path / "ids.pt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), *sys.path])}
    subprocess.run(
        [sys.executable, "-c", _FRESH, str(out), str(tmp_path / "ids.pt"), str(tmp_path / "fresh.pt")],
        check=True,
        env=env,
        timeout=120,
    )
    fresh = torch.load(tmp_path / "fresh.pt", weights_only=True)
    assert fresh["kind"] == "standardize"
    # the raw inputs, prepared by the export's preprocess, are the trainer's evaluation inputs bit for bit
    assert torch.equal(fresh["inputs"], trained["inputs"])
    assert torch.equal(fresh["logits"].argmax(-1), trained["logits"].argmax(-1))
    torch.testing.assert_close(fresh["logits"], trained["logits"])
    # and score what the trainer's evaluation scored
    labels = load_digits().labels[trained["ids"]]
    accuracy = float((fresh["logits"].argmax(-1) == labels).sum()) / len(labels)
    assert accuracy == trained["accuracy"]
    # raw inputs without the preprocessing are not what the model was trained on
    assert not torch.allclose(fresh["raw_logits"], fresh["logits"])


def test_preprocess_repeats_the_trainers_standardisation_and_refuses_bare_files(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from elastic_pipe import load_exported
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.data import Split, split_samples
    from elastic_pipe.orchestrator.persist.exported import ExportError, Preprocess, inference_record

    d = load_digits()
    config = config_from_tables({"model": tiny_vit.model_table(), "train": {"dtype": "float32", "seed": 3}})
    train, held = split_samples(d, 0.2, seed=3, dtype=torch.float32)
    record = inference_record(config, train, d)
    assert record["model"] == tiny_vit.model_table() and record["train"] == {"dtype": "float32", "seed": 3}
    assert record["preprocess"]["kind"] == "standardize"
    assert record["preprocess"]["std"] > 0 and record["preprocess"]["mean"] > 0
    # through JSON and back, as the export's metadata carries it
    preprocess = Preprocess(json.loads(json.dumps(record["preprocess"])))
    positions = torch.searchsorted(d.sample_ids, held.sample_ids)
    assert torch.equal(preprocess(d.inputs[positions]), held.inputs)
    # integer inputs (token ids) are not standardised: nothing to record, unless the data says how it tokenised
    ids = Split(torch.arange(20).reshape(10, 2), torch.zeros(10, dtype=torch.long), torch.arange(10))
    ids_train = split_samples(ids, 0.2, 3, torch.float32)[0]
    assert ids_train.standardization is None
    assert inference_record(config, ids_train, ids)["preprocess"] == {"kind": "none"}
    text = SimpleNamespace(tokenizer={"tokenizer": "minilm", "directory": None, "max_tokens": 16})
    assert inference_record(config, ids_train, text)["preprocess"] == {
        "kind": "tokenize",
        "tokenizer": "minilm",
        "directory": None,
        "max_tokens": 16,
    }
    assert inference_record(config, object(), object())["preprocess"] == {"kind": "none"}
    with pytest.raises(ExportError, match="unknown preprocessing kind 'resize'"):
        Preprocess({"kind": "resize"})

    bare = tmp_path / "bare.safetensors"
    save_file({"w": torch.zeros(2)}, str(bare))
    with pytest.raises(ExportError, match=r"has no 'elastic_pipe\.inference' metadata"):
        load_exported(bare)
    (tmp_path / "junk.safetensors").write_text("junk")
    with pytest.raises(ExportError, match=r"cannot read .*junk\.safetensors as safetensors"):
        load_exported(tmp_path / "junk.safetensors")


def test_text_preprocess_tokenises_as_the_bbcnews_dataset_did() -> None:
    from elastic_pipe import data as edata
    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.data import bbcnews
    from elastic_pipe.orchestrator.persist.exported import ExportError, Preprocess, inference_record

    held = bbcnews(16, "test")
    config = config_from_tables({"model": {"name": "minilm", "options": {"num_classes": 5}}})
    record = json.loads(json.dumps(inference_record(config, object(), held)))
    assert record["preprocess"] == {"kind": "tokenize", "tokenizer": "minilm", "directory": None, "max_tokens": 16}
    corpus = edata.load_bbcnews()
    texts = [corpus.texts[i] for i in corpus.split()[1][:12]]
    preprocess = Preprocess(record["preprocess"])
    assert torch.equal(preprocess(texts), held.ids[:12])
    assert torch.equal(preprocess(texts[0]), held.ids[:1])
    with pytest.raises(ExportError, match="takes a text or a list of texts"):
        preprocess([1, 2])
