"""``elastic-pipe plan``: table, JSON, plots, measured costs, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_pipe.cli import main

ISSUE_EXAMPLE = [
    "plan", "--model", "vit-b16", "--gpus", "16", "--gpus-per-node", "8", "--gpu-memory", "16GiB",
    "--alpha", "0.3333", "--epochs", "10",
]  # fmt: skip


def test_issue_example_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ISSUE_EXAMPLE) == 0
    out = capsys.readouterr().out
    assert out.startswith("vit-b16 on 16 GPUs")
    assert "speedup:" in out and "static baseline" in out
    assert len([line for line in out.splitlines() if line[:5].strip().isdigit()]) == 10


def test_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ISSUE_EXAMPLE, "--pipe-len", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["frozen"] for e in doc["epochs"]] == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]
    assert doc["epochs"][0]["pipe_len"] == 8 and doc["epochs"][0]["replicas"] == 2
    for e in doc["epochs"]:
        assert e["pipe_len"] * e["replicas"] == 16
        assert e["microbatches"] >= 1 and e["throughput"] > 0
        assert sum(e["partition"]["layers_per_stage"]) == 26 - e["partition"]["boundaries"][0]
    assert doc["speedup"] > 1 and doc["speedup_over_freeze_only"] > 1 and doc["transitions"] == 6
    assert doc["job"]["steps_per_epoch"] == 1252  # ImageNet-1k at the default batch of 64 x 16


def test_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ISSUE_EXAMPLE, "--pipe-len", "4", "--plot", str(tmp_path)]) == 0
    for name in ("planner_throughput.png", "planner_timeline.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000
    assert "wrote" in capsys.readouterr().out


def test_measured_costs_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = [{"name": f"l{i}", "params": 1000, "forward": 0.01, "backward": 0.02, "activation_bytes": 4096}
              for i in range(6)]  # fmt: skip
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"layers": layers, "unit_ends": [2, 3, 4, 5]}))
    argv = ["plan", "--costs", str(path), "--costs-batch", "8", "--gpus", "2", "--global-batch", "64", "--json",
            "--steps-per-epoch", "10", "--epochs", "4", "--alpha", "1/2", "--host-overhead-ms", "0"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "costs" and doc["units"] == 4
    assert [e["frozen"] for e in doc["epochs"]] == [0, 2, 3, 4]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "--model", "vit-x", "--gpus", "2"], "unknown model"),
        (["plan", "--gpus", "2"], "exactly one of --model"),
        (["plan", "--model", "vit-b16", "--gpus", "0"], "--gpus"),
        (["plan", "--model", "vit-b16", "--gpus", "2", "--alpha", "lots"], "--alpha"),
        (["plan", "--model", "vit-b16", "--gpus", "2", "--gpu-memory", "big"], "byte size"),
        (["plan", "--model", "vit-b16", "--gpus", "16", "--pipe-len", "3"], "pipe_len=3"),
        (["plan", "--model", "gpt2-xl", "--gpus", "1", "--gpu-memory", "4GiB"], "fits no layout"),
        (["plan", "--model", "vit-b16", "--gpus", "2", "--policy", "manual"], "--manual"),
        (["plan", "--costs", "/no/such/file.json", "--gpus", "2"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and needle in captured.err


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--model", "vit-b16", "--gpus", "two"])  # argparse's own type check
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    # --gpus is optional for argparse (plan --config needs none) but required with --model: one line, exit 2
    assert main(["plan", "--model", "vit-b16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need --gpus W" in err


def test_cache_filled_in_the_transition(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "vit-b16", "--gpus", "2", "--gpus-per-node", "2", "--global-batch", "512"]
    args += ["--dataset-size", "5120", "--epochs", "3", "--pipe-len", "1", "--microbatches", "1"]
    assert main([*args, "--cache-fill", "transition", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"]["cache_fill"] == "transition"
    first = doc["epochs"][1]
    assert first["cached"] == first["frozen"] == 4 and first["transition_seconds"] > 0
    parts = first["breakdown"]
    assert set(parts) == {"compute", "bubble", "transfers", "allreduce", "cache_reads", "optimizer", "host"}
    assert sum(parts.values()) == pytest.approx(first["step_time"])
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--cache-fill", "later"])
    assert exit_info.value.code == 2 and "invalid choice: 'later'" in capsys.readouterr().err


#: A training config for ``plan --config``: a small ViT on the digits, a fixed layout of 2 ranks.
CONFIG = """
[model]
name = "vit"
options = {{ preset = "vit-tiny", depth = 4, dim = 32, heads = 2, mlp_dim = 64 }}
[data]
dataset = "digits"
[train]
epochs = 2
global_batch = 32
[freeze]
policy = "never"
[pipeline]
pipe_len = 2
virtual = {virtual}
schedule = "{schedule}"
microbatches = 4
compression = "none"
[launch]
nproc_per_node = 2
"""


def _plan_config(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str, **pipeline: object) -> str:
    path = tmp_path / f"{pipeline['schedule']}_{pipeline['virtual']}.toml"
    path.write_text(CONFIG.format(**pipeline), encoding="utf-8")
    assert main(["plan", "--config", str(path), *flags]) == 0
    return capsys.readouterr().out


def test_plan_config_prints_v_and_the_predicted_bubble_per_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _plan_config(tmp_path, capsys, schedule="interleaved", virtual=2)
    head, columns, *rows = text.splitlines()
    assert head.startswith("schedule interleaved, v = 2 stage(s) per rank; steps predicted on 2 GPUs")
    assert columns.split()[:9] == ["epoch", "frozen", "units", "frozen", "sub-layers", "K", "v", "R", "M"]
    assert len(rows) == 2 and all(r.split()[3:6] == ["2", "2", "1"] for r in rows)  # K = 2, v = 2, R = 1
    docs = {
        v: json.loads(_plan_config(tmp_path, capsys, "--json", schedule=schedule, virtual=v))
        for schedule, v in (("1f1b", 1), ("interleaved", 2))
    }
    for v, doc in docs.items():
        assert doc["virtual"] == v and [e["virtual"] for e in doc["epochs"]] == [v, v]
        assert [len(e["boundaries"]) for e in doc["epochs"]] == [2 * v + 1] * 2  # K x v stages
        step = doc["epochs"][0]["predicted"]
        assert step["step_time"] > step["bubble"] > 0
        assert step["bubble_fraction"] == pytest.approx(
            step["bubble"] / (step["breakdown"]["compute"] + step["bubble"])
        )
    # the same K and micro-batches: two stages per rank idle less
    assert docs[2]["epochs"][0]["predicted"]["bubble_fraction"] < docs[1]["epochs"][0]["predicted"]["bubble_fraction"]


def test_virtual_sets_the_stages_per_rank_of_a_model_plan(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "vit-b16", "--gpus", "8", "--epochs", "2", "--pipe-len", "4", "--json"]
    assert main([*base, "--schedule", "interleaved", "--virtual", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"]["virtual"] == 3 and all(e["virtual"] == 3 for e in doc["epochs"])
    assert all(len(e["partition"]["layers_per_stage"]) == e["pipe_len"] * 3 for e in doc["epochs"])
    assert main([*base, "--virtual", "2"]) == 2  # 1f1b holds one stage per rank: one line
    assert "1f1b holds one stage per rank" in capsys.readouterr().err
