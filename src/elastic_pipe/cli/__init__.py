"""The ``elastic-pipe`` command line: argparse subcommands, one module each.

Every subcommand lives in its own module of this package and exposes three names:

* ``HELP``: the one-line summary shown by ``elastic-pipe --help``;
* ``add_arguments(parser)``: declares its options;
* ``run(args) -> int``: does the work and returns the exit code.

Importing a subcommand module is cheap (torch and the primitives load inside ``add_arguments`` or ``run``), and
:func:`main` declares the options of the one subcommand named on the command line only, so that ``elastic-pipe
--help`` and ``--version`` never import torch.

Conventions shared by all of them (see :mod:`elastic_pipe.cli._common`): ``--json`` makes stdout hold exactly
one complete JSON document or nothing; logs and progress go to stderr. Exit codes: 0 success; 2 bad input (a
usage error, or a ``ValueError``, ``OSError`` or :class:`~elastic_pipe.types.ElasticPipeError` such as a
``ConfigError``); 1 a failure at run time (a ``RuntimeError`` such as ``OrchestratorError``, or anything
unexpected); 130 interrupted. Every failure is one line on stderr, never a traceback; a training worker's
traceback goes to ``[log] dir``/error-rank<N>.txt, and with ``ELASTIC_PIPE_DEBUG=1`` to stderr too.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from elastic_pipe import __version__
from elastic_pipe.cli._common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    OneLineArgumentParser,
    clean_docstring,
    fail,
    json_output,
)
from elastic_pipe.types import ElasticPipeError

__all__ = ["COMMANDS", "build_parser", "exit_code", "main"]

#: Subcommand name -> module name inside this package, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "partition": "partition",
    "compress": "compress",
    "schedule": "schedule",
    "freeze-plan": "freeze_plan",
    "decode": "decode",
    "ranks": "ranks",
    "plan": "plan",
    "train": "train",
    "export": "export",
    "demo": "demo",
}

#: Exit code of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"elastic_pipe.cli.{COMMANDS[name]}")


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser.

    Args:
        commands: the subcommands whose options are declared (default: all of them). The others are listed with
            their one-line help only, which keeps ``--help`` from importing what their options need (torch).

    Returns:
        The parser; each declared subcommand sets ``args._run`` to its ``run`` function.
    """
    declared = set(COMMANDS if commands is None else commands)
    parser = OneLineArgumentParser(
        prog="elastic-pipe",
        description="Elastic pipeline training: freeze converged layers, compress the pipeline, add replicas.",
    )
    parser.add_argument("--version", action="version", version=f"elastic-pipe {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineArgumentParser)
    for name in COMMANDS:
        module = _command_module(name)
        help_text: str = module.HELP
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=clean_docstring(module.__doc__ or help_text),
            # keep the docstring's paragraphs and indented example blocks as written
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name in declared:
            module.add_arguments(cmd)
            cmd.set_defaults(_run=module.run)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand on the command line: the first word that is not a top-level option (they take no value)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def exit_code(exc: BaseException) -> int:
    """The exit code for an exception that ended a subcommand (see the module docstring)."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, RuntimeError):  # OrchestratorError: the input was fine, the run failed
        return EXIT_FAILURE
    if isinstance(exc, ElasticPipeError | ValueError | OSError):  # ConfigError, CliInputError, PartitionError...
        return EXIT_USAGE
    return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (0 success, 2 bad input, 1 failure at run time)."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = _named_command(words)
    parser = build_parser([] if command is None else [command])
    args = parser.parse_args(words)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"elastic-pipe {args.command}"
    try:
        with json_output(enabled=bool(getattr(args, "json", False))) as document:
            code: int = args._run(args)
    except Exception as exc:
        code = exit_code(exc)
        if code == EXIT_USAGE or isinstance(exc, ElasticPipeError):
            worker_traceback = getattr(exc, "traceback", None)  # a failed training worker's (WorkerFailedError)
            if os.environ.get("ELASTIC_PIPE_DEBUG") and isinstance(worker_traceback, str):
                sys.stderr.write(worker_traceback if worker_traceback.endswith("\n") else worker_traceback + "\n")
            return fail(prog, str(exc) or type(exc).__name__, code)
        if os.environ.get("ELASTIC_PIPE_DEBUG"):
            raise
        return fail(prog, f"unexpected {type(exc).__name__}: {exc} (set ELASTIC_PIPE_DEBUG=1 for a traceback)", code)
    except KeyboardInterrupt:
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    if document:
        sys.stdout.write(document[0])
        sys.stdout.flush()
    return code
