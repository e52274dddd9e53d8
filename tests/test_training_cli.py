"""``elastic-pipe train``: bad input fails fast (one line, exit 2), output renders exactly (the demo: test_demo.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_pipe.cli import main
from elastic_pipe.orchestrator.persist.files import FORMAT

GOOD = """
[model]
name = "vit"
options = {{ preset = "vit-tiny" }}
[pipeline]
pipe_len = 2
{extra}
[launch]
nproc_per_node = {nproc}
"""


def _write(tmp_path: Path, extra: str = "", nproc: int = 2) -> str:
    path = tmp_path / "run.toml"
    path.write_text(GOOD.format(extra=extra, nproc=nproc), encoding="utf-8")
    return str(path)


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("elastic-pipe train: error: ")
    return captured.err


@pytest.mark.parametrize(
    ("extra", "nproc", "message"),
    [
        ('solver = "magic"', 2, "unknown partition solver 'magic'"),
        ("", 3, "not divisible by pipe_len=2"),
        ('schedule = "zigzag"', 2, "unknown schedule 'zigzag'"),
    ],
)
def test_bad_config_is_one_line_exit_2(
    extra: str, nproc: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails(["train", "--config", _write(tmp_path, extra, nproc)], capsys)
    assert message in err


def test_unknown_policy_and_long_pipeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[model]\nname = "vit"\n[freeze]\npolicy = "sometimes"\n', encoding="utf-8")
    assert "unknown freeze policy 'sometimes'" in _fails(["train", "--config", str(path)], capsys)
    path.write_text(
        '[model]\nname = "vit"\noptions = { depth = 1 }\n[pipeline]\npipe_len = 8\n[launch]\nnproc_per_node = 8\n',
        encoding="utf-8",
    )
    assert "longer than the model" in _fails(["train", "--config", str(path)], capsys)


def test_missing_config_and_foreign_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "cannot read" in _fails(["train", "--config", str(tmp_path / "nope.toml")], capsys)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest.json").write_text(
        json.dumps({"format": FORMAT, "file": "epoch-0001.pt", "fingerprint": {"names": ["w"], "shapes": [[1]]}})
    )
    err = _fails(["train", "--config", _write(tmp_path), "--checkpoint-dir", str(ckpt)], capsys)
    assert "checkpoint is from another model" in err


def test_train_table_and_plot(tmp_path: Path) -> None:
    from elastic_pipe.cli.train import plot, render

    epoch = {
        "epoch": 0,
        "steps": 10,
        "frozen_units": 0,
        "pipe_len": 2,
        "replicas": 1,
        "cache": False,
        "loss": 1.25,
        "eval_loss": 1.5,
        "eval_accuracy": 0.5,
        "samples_per_s": 100.0,
        "seconds": 2.0,
        "grad_sync_ops_per_s": 0.0,
    }
    result = {
        "epochs": [epoch, {**epoch, "epoch": 1, "pipe_len": 1, "replicas": 2, "frozen_units": 2, "cache": True}],
        "transitions": [
            {"epoch": 1, "frozen_units": 2, "pipe_len": 1, "replicas": 2, "bytes_moved": 2e6, "seconds": 0.25}
        ],
        "final_accuracy": 0.5,
        "final_eval_loss": 1.5,
        "seconds": 4.5,
    }
    assert render(result).splitlines() == [
        "epoch  frozen  K  R  cache  loss     eval     acc    samples/s  step ms  sync ops/s",
        "    1       0  2  1    off  1.2500  1.5000  0.500      100.0    200.0         0.0",
        "    2       2  1  2     on  1.2500  1.5000  0.500      100.0    200.0         0.0",
        "transition before epoch 2: frozen 2 units, K=1 R=2, 2.00 MB moved, 0.250 s",
        "final eval loss 1.5000, accuracy 0.500, 4.5 s",
    ]
    plot(result, str(tmp_path / "run.png"))
    assert (tmp_path / "run.png").stat().st_size > 1000


def _overrides(argv: list[str], path: str) -> dict[str, object]:
    from elastic_pipe.cli import build_parser
    from elastic_pipe.cli.train import overrides_from
    from elastic_pipe.orchestrator import load_config

    args = build_parser(["train"]).parse_args(["train", "--config", path, *argv])
    return overrides_from(args, load_config(path))


def test_set_and_launch_flags_become_overrides(tmp_path: Path) -> None:
    from elastic_pipe.orchestrator import load_config

    path = _write(tmp_path)
    changes = _overrides(
        [
            "--set", "train.lr=0.01",
            "--set", "freeze.policy=alpha",
            "--set", "freeze.options={alpha=0.2}",
            "--set", "train.optimizer=adamw",  # a bare word is a string
            "--set", "model.options.depth=2",  # one entry of a table, the others kept
            "--set", "log.progress=false",
            "--nproc-per-node", "4", "--nnodes", "1", "--max-restarts", "3", "--rdzv-endpoint", "h:1",
            "--epochs", "5",
        ],
        path,
    )  # fmt: skip
    assert changes == {
        "train.lr": 0.01,
        "freeze.policy": "alpha",
        "freeze.options": {"alpha": 0.2},
        "train.optimizer": "adamw",
        "model.options": {"preset": "vit-tiny", "depth": 2},
        "log.progress": False,
        "train.epochs": 5,
        "launch.nproc_per_node": 4,
        "launch.nnodes": 1,
        "launch.max_restarts": 3,
        "launch.rdzv_endpoint": "h:1",
    }
    config = load_config(path).override(changes)
    assert (config.train.lr, config.freeze.policy_options, config.launch.max_restarts) == (0.01, {"alpha": 0.2}, 3)
    assert _overrides(["--resume", "never"], path) == {"checkpoint.resume": "never"}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("train.lrr=0.1", "unknown key 'lrr' in [train]"),
        ("trian.lr=0.1", "expected 'section.key' with a section of model"),
        ("train.lr", "expected SECTION.KEY=VALUE"),
        ("train.lr=-1", "train.lr must be a finite number > 0"),
        ("train.max_grad_norm=-1", "train.max_grad_norm must be a finite number >= 0"),
        ("log.eval_every=0", "log.eval_every must be an integer >= 1"),
        ("pipeline.pipe_len.x=1", "pipeline.pipe_len is not a table"),
    ],
)
def test_bad_set_is_one_line_exit_2(
    setting: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _fails(["train", "--config", _write(tmp_path), "--set", setting], capsys)


def test_resume_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no checkpoint there" in _fails(["train", "--config", path, "--resume", str(empty)], capsys)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest.json").write_text("{}")
    assert _overrides(["--resume", str(ckpt)], path) == {"checkpoint.dir": str(ckpt), "checkpoint.resume": "auto"}
    err = _fails(["train", "--config", path, "--resume", str(ckpt), "--checkpoint-dir", str(empty)], capsys)
    assert "conflicts with --checkpoint-dir" in err


def test_table_without_evaluation() -> None:
    from elastic_pipe.cli.train import render

    epoch = {
        "epoch": 0, "steps": 10, "frozen_units": 0, "pipe_len": 1, "replicas": 1, "cache": False, "loss": 1.25,
        "eval_loss": None, "eval_accuracy": None, "samples_per_s": 100.0, "seconds": 2.0, "grad_sync_ops_per_s": 0.0,
    }  # fmt: skip
    result = {"epochs": [epoch], "transitions": [], "final_accuracy": None, "final_eval_loss": 1.0, "seconds": 2.0}
    assert (
        render(result).splitlines()[1]
        == "    1       0  1  1    off  1.2500       -      -      100.0    200.0         0.0"
    )
