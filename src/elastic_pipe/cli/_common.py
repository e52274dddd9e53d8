"""Helpers shared by the subcommands: one-line errors, JSON output, input files, upper bounds, help text."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NoReturn

from elastic_pipe.types import ElasticPipeError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "CliInputError",
    "OneLineArgumentParser",
    "add_json_flag",
    "check_limit",
    "clean_docstring",
    "dumps_document",
    "emit",
    "fail",
    "first_non_finite",
    "json_output",
    "jsonable",
    "not_built",
    "read_json_file",
]

#: Bad input: a usage error, an unreadable or invalid file, a value out of range.
EXIT_USAGE = 2
#: The input was fine but the run failed (a training worker died, something unexpected).
EXIT_FAILURE = 1


class CliInputError(ElasticPipeError, ValueError):
    """Bad command-line input that argparse itself cannot detect (file contents, combinations of flags)."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        sys.stderr.write(f"{self.prog}: error: {one_line} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


def fail(prog: str, message: str, code: int = EXIT_USAGE) -> int:
    """Print ``prog: error: message`` as a single line on stderr and return ``code``."""
    one_line = " ".join(message.split())
    sys.stderr.write(f"{prog}: error: {one_line}\n")
    return code


def check_limit(flag: str, value: int, limit: int, reason: str) -> None:
    """Refuse ``value`` above ``limit``: larger inputs would run for hours or exhaust memory.

    Raises:
        CliInputError: naming the flag, the value, the limit and why the limit exists.
    """
    if value > limit:
        raise CliInputError(f"{flag} {value} is above the limit of {limit} ({reason})")


_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def clean_docstring(doc: str) -> str:
    """A module docstring as plain text for ``--help``: no reST markup, indented example blocks kept.

    ``Examples::`` becomes ``Examples:``, ````literal```` becomes ``literal`` and ``:mod:`~a.b``` becomes ``b``.
    """

    def role(match: re.Match[str]) -> str:
        tilde, target = match.groups()
        return target.rsplit(".", 1)[-1] if tilde else target

    lines = [line.rstrip() for line in doc.strip("\n").splitlines()]
    text = "\n".join(line[:-1] if line.endswith("::") else line for line in lines)
    return _ROLE.sub(role, text).replace("``", "")


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add the standard ``--json`` flag."""
    parser.add_argument(
        "--json", action="store_true", help="print exactly one JSON document on stdout (logs stay on stderr)"
    )


def jsonable(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by ``None`` and tuples by lists (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def first_non_finite(value: Any, path: str = "") -> str | None:
    """The path (``epochs[0].step_time``) of the first NaN or infinity in a JSON-like document, or ``None``."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path or 'the result'} = {value!r}"
    items: Any = ()
    if isinstance(value, dict):
        items = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    for where, item in items:
        found = first_non_finite(item, where)
        if found is not None:
            return found
    return None


def dumps_document(document: Any) -> str:
    """Encode one complete JSON document (strict JSON: non-finite numbers become ``null``), newline-terminated."""
    return json.dumps(jsonable(document), indent=2, allow_nan=False) + "\n"


#: Where :func:`emit` puts the ``--json`` document while :func:`json_output` is active.
_DOCUMENT: ContextVar[list[str] | None] = ContextVar("elastic_pipe_cli_document", default=None)


@contextlib.contextmanager
def json_output(enabled: bool) -> Iterator[list[str]]:
    """Hold back the ``--json`` document until the subcommand has succeeded.

    While active, :func:`emit` stores the encoded document in the yielded list instead of printing it, and any
    other write to stdout goes to stderr, so that stdout gets exactly one complete document or, after an error,
    nothing. The caller prints the document. Disabled, this changes nothing.
    """
    box: list[str] = []
    if not enabled:
        yield box
        return
    token = _DOCUMENT.set(box)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield box
    finally:
        _DOCUMENT.reset(token)


def emit(args: argparse.Namespace, document: dict[str, Any], text: str) -> None:
    """Print ``document`` as JSON when ``--json`` was given, else the human-readable ``text``.

    The document is encoded completely before anything is written (an encoding error leaves stdout empty).
    """
    if getattr(args, "json", False):
        encoded = dumps_document(document)
        box = _DOCUMENT.get()
        if box is None:
            sys.stdout.write(encoded)
        else:
            assert not box, "a subcommand emitted two JSON documents"
            box.append(encoded)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def read_json_file(path: str | Path) -> Any:
    """Read a JSON file, turning every failure into a :class:`CliInputError` naming the file."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliInputError(f"cannot read {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CliInputError(f"{p} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CliInputError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError:
        raise CliInputError(f"{p} is nested too deeply to read as JSON") from None


def not_built(command: str, issue: str) -> int:
    """Say that a reserved subcommand is not built yet and return exit code 2."""
    return fail(f"elastic-pipe {command}", f"not built yet (tracked in {issue})")
