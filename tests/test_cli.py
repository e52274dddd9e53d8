"""The CLI skeleton: subcommands listed, --version, one-line errors with exit code 2."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

import pytest

from elastic_pipe import __version__
from elastic_pipe.cli import COMMANDS, build_parser, exit_code, main, ranks
from elastic_pipe.cli._common import CliInputError, clean_docstring, emit, first_non_finite
from elastic_pipe.orchestrator.errors import ConfigError, OrchestratorError


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_has_real_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"elastic-pipe {name}" in out
    assert "--json" in out or name in ("train",)


def test_unknown_option_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["partition", "--no-such-flag"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err


def test_no_command_is_usage_error() -> None:
    assert main([]) == 2


def test_parser_builds() -> None:
    assert build_parser().prog == "elastic-pipe"


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_pipe", "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and __version__ in proc.stdout


def test_help_and_version_import_no_torch() -> None:
    code = (
        "import sys\n"
        "from elastic_pipe.cli import main\n"
        "for argv in (['--version'], ['--help'], ['freeze-plan', '--help'], ['ranks', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, argv\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert __version__ in proc.stdout


@pytest.mark.parametrize("name", ["freeze-plan", "plan", "schedule"])
def test_help_keeps_examples_as_an_indented_block(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([name, "--help"])
    out = capsys.readouterr().out
    assert "Examples:\n\n    elastic-pipe " in out
    assert "::" not in out and "``" not in out
    examples = out.split("Examples:\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(examples) >= 2 and all(line.startswith(f"    elastic-pipe {name} ") for line in examples)


def test_clean_docstring_drops_rest_markup() -> None:
    text = "Uses :mod:`~elastic_pipe.freeze` and :func:`elastic_pipe.cli.main`::\n\n    ``x`` stays\n"
    assert clean_docstring(text) == "Uses freeze and elastic_pipe.cli.main:\n\n    x stays"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (OrchestratorError("training failed after 0 restart(s): rank 1 died"), 1),
        (ConfigError("pipe_len=3 does not divide 4"), 2),
        (CliInputError("--stages 0"), 2),
        (ValueError("bad value"), 2),
        (FileNotFoundError(2, "No such file", "x.toml"), 2),
        (RuntimeError("CUDA error"), 1),
        (KeyError("boom"), 1),
        (KeyboardInterrupt(), 130),
    ],
)
def test_exit_codes(
    error: BaseException, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: object) -> int:
        raise error

    monkeypatch.setattr(ranks, "run", run)
    assert exit_code(error) == code
    assert main(["ranks", "--world-size", "2", "--pipe-len", "1", "--json"]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("elastic-pipe ranks: error: ")


def test_json_is_held_back_and_dropped_on_a_later_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> int:
        print("stray output")  # goes to stderr while a --json document is pending
        emit(args, {"half": "done"}, "text")
        raise OrchestratorError("rank 0 failed after the document")

    monkeypatch.setattr(ranks, "run", run)
    assert main(["ranks", "--world-size", "2", "--pipe-len", "1", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "stray output" in captured.err


def test_json_encodes_nan_and_inf_as_null(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def run(args: argparse.Namespace) -> int:
        emit(args, {"loss": math.nan, "costs": (1.0, math.inf, -math.inf), "nested": {"x": [math.nan]}}, "text")
        return 0

    monkeypatch.setattr(ranks, "run", run)
    assert main(["ranks", "--world-size", "2", "--pipe-len", "1", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"loss": None, "costs": [1.0, None, None], "nested": {"x": [None]}}
    assert "NaN" not in out and "Infinity" not in out and out.endswith("}\n")


def test_json_document_is_complete_or_absent_when_unencodable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(args: argparse.Namespace) -> int:
        emit(args, {"ok": 1, "then": object()}, "text")
        return 0

    monkeypatch.setattr(ranks, "run", run)
    assert main(["ranks", "--world-size", "2", "--pipe-len", "1", "--json"]) == 1
    assert capsys.readouterr().out == ""


def test_first_non_finite_names_the_path() -> None:
    assert first_non_finite({"epochs": [{"t": 1.0}, {"t": math.inf}]}) == "epochs[1].t = inf"
    assert first_non_finite({"a": [1, 2.5, "x"]}) is None
