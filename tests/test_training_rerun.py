"""Re-runs say what they do (issue 45): a finished run is not trained again and says so (exit 0, no NaN), a config
that differs from the checkpoint's in more than a resume may change is refused with one line naming the keys unless
allowed (then recorded), and ``events.jsonl`` gets a ``resume`` record and no epoch twice."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.persist.rerun import already_complete, check_config, config_changes, config_defaults
from elastic_pipe.testing import RankContext, run_distributed

TOML = """
[model]
name = "vit"
options = {{ preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32, patch_size = 4 }}
[data]
eval_fraction = 0.8
[train]
epochs = 2
global_batch = 64
lr = 0.001
[freeze]
policy = "manual"
options = {{ schedule = {{ 1 = 1 }} }}
[pipeline]
pipe_len = 2
microbatches = 2
cache = "off"
[launch]
nproc_per_node = 2
[log]
progress = false
dir = "{tmp}/log"
[checkpoint]
dir = "{tmp}/ckpt"
"""


def test_what_a_resume_may_change() -> None:
    base = config_from_tables({"model": {"name": "vit"}, "checkpoint": {"dir": "c"}})
    saved = json.loads(json.dumps(base.to_dict()))  # as latest.json keeps it
    free = base.override(
        {
            "train.epochs": 9,
            "train.max_steps": 3,
            "log.dir": "x",
            "launch.nproc_per_node": 4,
            "pipeline.pipe_len": 2,
            "pipeline.virtual": 2,  # the checkpoint's layout is re-cut to 2 stages per rank
            "pipeline.schedule": "interleaved",
            "checkpoint.every": 2,
        }
    )
    assert config_changes(saved, free.to_dict()) == {}
    # a checkpoint from before [pipeline] virtual resumes with another v too
    del saved["pipeline"]["virtual"]
    assert config_changes(saved, free.to_dict(), config_defaults(free)) == {}
    changed = base.override({"train.lr": 0.01, "model.options": {"depth": 2}})
    assert config_changes(saved, changed.to_dict()) == {
        "model.options": [{}, {"depth": 2}],
        "train.lr": [base.train.lr, 0.01],
    }
    with pytest.raises(ConfigError, match=r"differs from the checkpoint's in model\.options, train\.lr \(") as info:
        check_config({"config": saved}, changed)
    assert "\n" not in str(info.value) and "--allow-config-change" in str(info.value)
    allowed = changed.override({"checkpoint.allow_config_change": True})
    assert set(check_config({"config": saved}, allowed)) == {"model.options", "train.lr"}
    assert check_config({"epoch": 1}, changed) == {}  # a checkpoint that kept no config is not compared
    assert already_complete({"epoch": 1, "step": 5}, base) is None
    assert already_complete({"epoch": base.train.epochs, "step": 50}, base) == (
        f"run already complete ({base.train.epochs} epochs); --epochs N to continue, --resume never to start afresh"
    )
    assert "max_steps 5 reached" in str(
        already_complete({"epoch": 0, "step": 5}, base.override({"train.max_steps": 5}))
    )


def test_a_key_newer_than_the_checkpoint_counts_as_unchanged_only_at_its_default() -> None:
    """A checkpoint written before a key (here ``[pipeline] cache_dtype``) existed resumes under its default;
    another value is a change, and so is a key the checkpoint lacks whose value here is not its default."""
    base = config_from_tables({"model": {"name": "vit"}, "checkpoint": {"dir": "c"}})
    saved = json.loads(json.dumps(base.to_dict()))
    del saved["pipeline"]["cache_dtype"]  # as a checkpoint from before the key kept its config
    assert check_config({"config": saved}, base) == {}
    narrow = base.override({"pipeline.cache_dtype": "bfloat16"})
    with pytest.raises(
        ConfigError, match=r"checkpoint's in pipeline\.cache_dtype \(pipeline\.cache_dtype None -> 'bfloat16'\)"
    ):
        check_config({"config": saved}, narrow)
    defaults = config_defaults(base)
    assert defaults["pipeline"]["cache_dtype"] == "auto" and defaults["model"]["name"] == ""
    del saved["model"]["name"]
    assert config_changes(saved, base.to_dict(), defaults) == {"model.name": [None, "vit"]}


def _runs(ctx: RankContext, path: str) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer, load_config

    base = load_config(path)
    out: dict[str, Any] = {}

    def fit(name: str, changes: dict[str, Any]) -> None:
        try:
            with ElasticTrainer(base.override(changes), quiet=True) as trainer:
                result = trainer.fit()
            out[name] = {"epochs": len(result.epochs), "eval": result.final_eval_loss, "acc": result.final_accuracy}
        except ConfigError as exc:
            out[name] = {"error": str(exc)}

    # stopped inside epoch 1 (5 steps an epoch here), then resumed to the end: epoch 1 is logged once
    fit("stopped", {"train.max_steps": 7})
    fit("resumed", {})
    fit("again", {})  # finished: nothing trained, the last evaluation reported
    fit("changed", {"train.lr": 0.01})
    fit("allowed", {"train.lr": 0.01, "train.epochs": 3, "checkpoint.allow_config_change": True})
    del ctx
    return out


@pytest.mark.distributed
@pytest.mark.slow  # five short runs in one job: about 30 s on 2 shared cores
def test_reruns_say_what_they_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from elastic_pipe.cli import main

    path = tmp_path / "run.toml"
    path.write_text(TOML.format(tmp=tmp_path), encoding="utf-8")
    out = run_distributed(_runs, 2, str(path), timeout=240)[0]
    assert out["stopped"]["epochs"] == 2 and out["resumed"]["epochs"] == 3  # history: epoch 1's partial record too
    again, resumed = out["again"], out["resumed"]
    assert not math.isnan(again["eval"]) and (again["eval"], again["acc"]) == (resumed["eval"], resumed["acc"])
    assert "train.lr 0.001 -> 0.01" in out["changed"]["error"]
    assert out["allowed"]["epochs"] > out["resumed"]["epochs"]
    records = [json.loads(line) for line in (tmp_path / "log" / "events.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0, 1, 2]  # no epoch twice
    resumes = [r for r in records if r["kind"] == "resume"]
    assert [(r["epoch"], r["step"]) for r in resumes] == [(1, 7), (2, 10), (2, 10)]
    assert [r["config_changes"] for r in resumes] == [{}, {}, {"train.lr": [0.001, 0.01]}]
    # the CLI: the finished 3-epoch run (at lr 0.01) is complete; no process starts, no NaN
    capsys.readouterr()
    argv = ["train", "--config", str(path), "--set", "train.lr=0.01"]
    assert main([*argv, "--epochs", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "nan" not in captured.err
    assert captured.err == "run already complete (3 epochs); --epochs N to continue, --resume never to start afresh\n"
    # another learning rate than the checkpoint's: one line, exit 2, naming the key
    assert main(["train", "--config", str(path), "--epochs", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differs from the checkpoint's in train.lr" in err
