"""``elastic-pipe partition`` and ``elastic-pipe compress``: JSON contract, text output, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_pipe.cli import main


def write(tmp_path: Path, data: object, name: str = "costs.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return str(path)


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    document: dict[str, object] = json.loads(out)
    return document


def test_partition_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    costs = write(tmp_path, [1, 2, 3, 4, 5, 6])
    doc = run_json(["partition", "--costs", costs, "--stages", "3", "--solver", "optimal"], capsys)
    assert doc["layers_per_stage"] == [3, 2, 1]
    assert doc["stage_costs"] == [6.0, 9.0, 6.0]
    assert doc["boundaries"] == [0, 3, 5, 6]
    assert doc["bottleneck"] == 9.0
    assert isinstance(doc["solve_seconds"], float) and doc["solve_seconds"] >= 0
    assert doc["solver"] == "optimal"


def test_partition_greedy_uses_the_published_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    costs = write(tmp_path, [2e6, 4e6, 2e6, 4e6, 2e6, 4e6])
    doc = run_json(["partition", "--costs", costs, "--stages", "3", "--solver", "greedy"], capsys)
    assert doc["layers_per_stage"] == [2, 2, 2]
    assert doc["stage_costs"] == [6e6, 6e6, 6e6]
    raw = run_json(
        ["partition", "--costs", costs, "--stages", "3", "--solver", "greedy", "--unit", "1", "--allow-empty"], capsys
    )
    assert raw["layers_per_stage"] == [6, 0, 0]


def test_partition_records_and_frozen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = [{"name": f"l{i}", "params": 6, "forward": 1.0, "backward": 2.0} for i in range(4)]
    costs = write(tmp_path, {"layers": layers})
    doc = run_json(["partition", "--costs", costs, "--stages", "2", "--metric", "time", "--frozen", "2"], capsys)
    # weights [0.5, 0.5, 3, 3]: best is [0.5, 0.5, 3 | 3] -> 4 | 3
    assert doc["layers_per_stage"] == [3, 1]
    assert doc["stage_costs"] == [4.0, 3.0]
    greedy = run_json(
        ["partition", "--costs", costs, "--stages", "2", "--solver", "greedy", "--unit", "1", "--frozen", "2"], capsys
    )
    assert greedy["layers_per_stage"][0] >= 2  # type: ignore[index]


def test_partition_graph_solver_on_a_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = [
        {"name": "a", "forward": 1.0, "activation_bytes": 100},
        {"name": "b", "forward": 1.0, "activation_bytes": 1},
        {"name": "c", "forward": 1.0, "activation_bytes": 1},
    ]
    costs = write(tmp_path, {"layers": layers})
    argv = ["partition", "--costs", costs, "--stages", "2", "--solver", "graph", "--metric", "time"]
    doc = run_json([*argv, "--bandwidth", "10"], capsys)
    # cut after a: 1 + 10 and 2 + 10 -> 12; after b: 2 + 0.1 and 1 + 0.1 -> 2.1
    assert doc["layers_per_stage"] == [2, 1]
    assert doc["stage_costs"] == pytest.approx([2.1, 1.1])


def test_partition_text_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    costs = write(tmp_path, [1, 1, 1, 1])
    assert main(["partition", "--costs", costs, "--stages", "2", "--solver", "uniform"]) == 0
    out = capsys.readouterr().out
    assert "solver uniform: 4 layers on 2 stages, bottleneck 2" in out
    assert "0..1" in out and "2..3" in out


@pytest.mark.parametrize(
    ("content", "options", "message"),
    [
        ("[1, -2]", ["--stages", "1"], "costs[1] must be a finite number >= 0, got -2.0"),
        ("[1, NaN]", ["--stages", "1"], "got nan"),
        ("[1, Infinity]", ["--stages", "1"], "got inf"),
        ("[1, 2]", ["--stages", "0"], "stages must be >= 1, got 0"),
        ("[1, 2]", ["--stages", "3"], "cannot cut 2 layers into 3 non-empty stages"),
        ("[1, 2", ["--stages", "1"], "is not valid JSON"),
        ('{"layers": 3}', ["--stages", "1"], 'expected a JSON list of numbers or {"layers": [...]}'),
        ('["a"]', ["--stages", "1"], "item 0 is 'a', expected a number"),
        ('{"layers": [{"flops": 1}]}', ["--stages", "1"], "unknown keys ['flops']"),
        ('{"layers": [{"params": -1}]}', ["--stages", "1"], "params must be a finite number >= 0"),
        ("[1, 2]", ["--stages", "1", "--solver", "nope"], "unknown solver 'nope'; valid solvers: graph, greedy"),
        ("[1, 2]", ["--stages", "1", "--frozen", "5"], "frozen must be an int in 0..2"),
    ],
)
def test_partition_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, options: list[str], message: str
) -> None:
    costs = write(tmp_path, content)
    assert main(["partition", "--costs", costs, *options, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("elastic-pipe partition: error:")
    assert message in captured.err


def test_partition_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["partition", "--costs", str(tmp_path / "none.json"), "--stages", "1"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_compress_halving_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    costs = write(tmp_path, [2e6, 4e6, 2e6, 4e6])
    doc = run_json(["compress", "--costs", costs, "--from", "4", "--budget", "6e6"], capsys)
    assert doc["pipe_len"] == 2
    assert doc["rule"] == "halving"
    partition = doc["partition"]
    assert isinstance(partition, dict)
    assert partition["layers_per_stage"] == [2, 2] and partition["solver"] == "greedy"
    assert doc["tried"] == [{"pipe_len": 2, "bottleneck": 6e6}, {"pipe_len": 1, "bottleneck": 12e6}]


def test_compress_memory_rule_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = [{"name": f"l{i}", "memory_bytes": 3 * 2**30} for i in range(6)]
    costs = write(tmp_path, {"layers": layers})
    doc = run_json(["compress", "--costs", costs, "--from", "6", "--budget", "9GiB", "--rule", "memory"], capsys)
    assert doc["pipe_len"] == 2
    assert doc["partition"]["layers_per_stage"] == [3, 3]  # type: ignore[index]
    assert main(["compress", "--costs", costs, "--from", "6", "--budget", "9GiB", "--rule", "memory"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipe_len: 2 (rule memory")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "4", "--budget", "lots"], "cannot read 'lots' as a size"),
        (["--from", "0", "--budget", "1"], "from_stages must be an int >= 1, got 0"),
        (["--from", "4", "--budget", "1", "--rule", "memory"], "no pipeline length dividing 4 devices fits"),
        (["--from", "4", "--budget", "1", "--solver", "nope"], "unknown solver 'nope'"),
    ],
)
def test_compress_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    costs = write(tmp_path, [1, 2, 3, 4])
    assert main(["compress", "--costs", costs, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
