"""Helpers shared by the subcommands: one-line errors, JSON output, input files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from elastic_pipe.types import ElasticPipeError

__all__ = [
    "EXIT_USAGE",
    "CliInputError",
    "OneLineArgumentParser",
    "add_json_flag",
    "emit",
    "fail",
    "not_built",
    "read_json_file",
]

EXIT_USAGE = 2


class CliInputError(ElasticPipeError, ValueError):
    """Bad command-line input that argparse itself cannot detect (file contents, combinations of flags)."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


def fail(prog: str, message: str, code: int = EXIT_USAGE) -> int:
    """Print ``prog: error: message`` as a single line on stderr and return ``code``."""
    one_line = " ".join(message.split())
    sys.stderr.write(f"{prog}: error: {one_line}\n")
    return code


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add the standard ``--json`` flag."""
    parser.add_argument(
        "--json", action="store_true", help="print exactly one JSON document on stdout (logs stay on stderr)"
    )


def emit(args: argparse.Namespace, document: dict[str, Any], text: str) -> None:
    """Print ``document`` as JSON when ``--json`` was given, else the human-readable ``text``."""
    if getattr(args, "json", False):
        json.dump(document, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def read_json_file(path: str | Path) -> Any:
    """Read a JSON file, turning every failure into a :class:`CliInputError` naming the file."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliInputError(f"cannot read {p}: {exc.strerror or exc}") from exc
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CliInputError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc


def not_built(command: str, issue: str) -> int:
    """Say that a reserved subcommand is not built yet and return exit code 2."""
    return fail(f"elastic-pipe {command}", f"not built yet (tracked in {issue})")
