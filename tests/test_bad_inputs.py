"""Bad command-line input, table-driven: every case exits 2 with one stderr line naming the bad value.

The CLI runs in-process (``main([...])``): argparse usage errors raise ``SystemExit(2)``, everything else returns
2; either way stdout stays empty (the ``--json`` document is all or nothing) and no traceback is printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_pipe.cli import main

#: A costs file written for each case; ``COSTS`` in an argv is replaced by its path.
GOOD_COSTS = "[1, 2, 3, 4]"

CASES: list[tuple[str, list[str], str, str]] = [
    # (subcommand, argv after it, costs file content, text the error line must hold)
    ("partition", ["--costs", "COSTS", "--stages", "0"], GOOD_COSTS, "got 0"),
    ("partition", ["--costs", "COSTS", "--stages", "9"], GOOD_COSTS, "into 9"),
    ("partition", ["--costs", "COSTS", "--stages", "two"], GOOD_COSTS, "'two'"),
    ("partition", ["--costs", "COSTS", "--stages", "2", "--solver", "magic"], GOOD_COSTS, "'magic'"),
    ("partition", ["--costs", "COSTS", "--stages", "2", "--frozen", "-1"], GOOD_COSTS, "-1"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], "[1, -5]", "-5"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], '[1, "x"]', "'x'"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], "[1, NaN]", "nan"),
    ("partition", ["--costs", "COSTS", "--stages", "2"], "[[[[", "not valid JSON"),
    ("partition", ["--costs", "/no/such/costs.json", "--stages", "2"], GOOD_COSTS, "/no/such/costs.json"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "plenty"], GOOD_COSTS, "'plenty'"),
    ("compress", ["--costs", "COSTS", "--from", "0", "--budget", "10"], GOOD_COSTS, "got 0"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "10", "--solver", "magic"], GOOD_COSTS, "'magic'"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "10", "--rule", "fold"], GOOD_COSTS, "'fold'"),
    ("compress", ["--costs", "COSTS", "--from", "4", "--budget", "10"], "{}", "got dict"),
    ("schedule", ["--kind", "2f2b", "--stages", "4", "--microbatches", "8"], "", "'2f2b'"),
    ("schedule", ["--kind", "1f1b", "--stages", "0", "--microbatches", "8"], "", "got 0"),
    ("schedule", ["--kind", "1f1b", "--stages", "4", "--microbatches", "-3"], "", "got -3"),
    ("schedule", ["--kind", "1f1b", "--stages", "1000000000", "--microbatches", "8"], "", "1000000000"),
    ("schedule", ["--kind", "1f1b", "--stages", "4", "--microbatches", "1000000000"], "", "1000000000"),
    (
        "schedule",
        ["--kind", "interleaved", "--stages", "4", "--microbatches", "8", "--chunks", "1000000000"],
        "",
        "1000000000",
    ),
    ("schedule", ["--kind", "1f1b", "--stages", "512", "--microbatches", "4096"], "", "6291456"),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", '{"forward": 1e308}'],
        "",
        "inf",
    ),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", '{"forward": -1}'],
        "",
        "-1",
    ),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", '{"speed": 1}'],
        "",
        "speed",
    ),
    (
        "schedule",
        ["--kind", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", "{oops"],
        "",
        "not valid JSON",
    ),
    (
        "freeze-plan",
        ["--policy", "alpha", "--alpha", "0.5", "--layers", "12", "--epochs", "1000000000"],
        "",
        "1000000000",
    ),
    (
        "freeze-plan",
        ["--policy", "alpha", "--alpha", "0.5", "--layers", "1000000000", "--epochs", "3"],
        "",
        "1000000000",
    ),
    (
        "freeze-plan",
        ["--policy", "freezeout", "--t0", "0.5", "--layers", "100000", "--epochs", "100000"],
        "",
        "10000000000",
    ),
    ("freeze-plan", ["--policy", "alpha", "--alpha", "7/0", "--layers", "12", "--epochs", "3"], "", "'7/0'"),
    ("freeze-plan", ["--policy", "alpha", "--alpha", "2", "--layers", "12", "--epochs", "3"], "", "2"),
    ("freeze-plan", ["--policy", "sometimes", "--layers", "12", "--epochs", "3"], "", "'sometimes'"),
    ("freeze-plan", ["--policy", "manual", "--schedule", "x:y", "--layers", "12", "--epochs", "3"], "", "x:y"),
    ("freeze-plan", ["--policy", "alpha", "--alpha", "0.5", "--layers", "-4", "--epochs", "3"], "", "-4"),
    ("decode", ["zz"], "", "not hex"),
    ("decode", ["00ff"], "", "2 bytes"),
    ("decode", ["--legacy", "1, 2, x"], "", "'x'"),
    ("decode", ["--legacy", "1, 2, 3"], "", "3"),
    ("decode", ["--legacy", "--num-layers", "-2", "1,2"], "", "-2"),
    ("decode", ["00", "--num-layers", "3"], "", "--num-layers"),
    ("ranks", ["--world-size", "1000000000", "--pipe-len", "1"], "", "1000000000"),
    ("ranks", ["--world-size", "16384", "--pipe-len", "1"], "", "268451840"),
    ("ranks", ["--world-size", "8", "--pipe-len", "3"], "", "3"),
    ("ranks", ["--world-size", "0", "--pipe-len", "1"], "", "0"),
    ("ranks", ["--world-size", "8", "--pipe-len", "2", "--layout", "ring"], "", "'ring'"),
    ("ranks", ["--world-size", "8", "--pipe-len", "2", "--initial-pipe-len", "4"], "", "--initial-pipe-len"),
    (
        "ranks",
        ["--world-size", "8", "--pipe-len", "2", "--layout", "pipetransformer", "--initial-pipe-len", "3"],
        "",
        "3",
    ),
    ("plan", ["--model", "vit-b16", "--gpus", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--epochs", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--microbatches", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--pipe-len", "1000000000"], "", "1000000000"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--epochs", "2", "--host-overhead-ms", "1e308"], "", "inf"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--epochs", "2", "--intra-bw", "1e-308"], "", "overflow"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--gpu-tflops", "0"], "", "got 0"),
    ("plan", ["--model", "vit-huge9", "--gpus", "16"], "", "vit-huge9"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--alpha", "lots"], "", "'lots'"),
    ("plan", ["--model", "vit-b16", "--gpus", "16", "--cache-fill", "later"], "", "'later'"),
    ("plan", ["--costs", "COSTS", "--gpus", "2"], '{"layers": []}', "non-empty"),
]


def _case_id(case: tuple[str, list[str], str, str]) -> str:
    command, argv, _, _ = case
    return f"{command}:{' '.join(argv)[:60]}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_input_exits_2_with_one_line(
    case: tuple[str, list[str], str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command, argv, content, needle = case
    costs = tmp_path / "costs.json"
    costs.write_text(content, encoding="utf-8")
    words = [command, *(str(costs) if word == "COSTS" else word for word in argv), "--json"]
    try:
        code = main(words)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code  # type: ignore[assignment]
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.endswith("\n"), captured.err
    assert captured.err.startswith(f"elastic-pipe {command}: error: ")
    assert needle in captured.err, captured.err
    assert "Traceback" not in captured.err


def test_every_data_subcommand_has_cases() -> None:
    counts = {command: sum(1 for c in CASES if c[0] == command) for command, *_ in CASES}
    assert set(counts) == {"partition", "compress", "schedule", "freeze-plan", "decode", "ranks", "plan"}
    assert min(counts.values()) >= 5
