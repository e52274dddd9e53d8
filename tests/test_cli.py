"""The CLI skeleton: subcommands listed, --version, one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elastic_pipe import __version__
from elastic_pipe.cli import COMMANDS, build_parser, main


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
