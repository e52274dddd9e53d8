"""The ``elastic-pipe`` command line: argparse subcommands, one module each.

Every subcommand lives in its own module of this package and exposes three names:

* ``HELP``: the one-line summary shown by ``elastic-pipe --help``;
* ``add_arguments(parser)``: declares its options;
* ``run(args) -> int``: does the work and returns the exit code.

Conventions shared by all of them (see :mod:`elastic_pipe.cli._common`): ``--json`` makes stdout hold exactly
one JSON document and nothing else; logs and progress go to stderr; bad input raises an
:class:`~elastic_pipe.types.ElasticPipeError` (or ``ValueError``/``OSError``), which :func:`main` turns into one
line on stderr and exit code 2, never a traceback.
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
from elastic_pipe.cli._common import EXIT_USAGE, OneLineArgumentParser, fail
from elastic_pipe.types import ElasticPipeError

__all__ = ["COMMANDS", "build_parser", "main"]

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
    "demo": "demo",
}


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"elastic_pipe.cli.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand registered."""
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
        cmd = sub.add_parser(name, help=help_text, description=module.__doc__ or help_text)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (0 success, 2 bad input, 1 unexpected failure)."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
        code: int = args._run(args)
    except (ElasticPipeError, ValueError, OSError) as exc:
        return fail(prog, str(exc))
    except KeyboardInterrupt:
        return fail(prog, "interrupted", code=130)
    except Exception as exc:
        if os.environ.get("ELASTIC_PIPE_DEBUG"):
            raise
        return fail(prog, f"unexpected {type(exc).__name__}: {exc} (set ELASTIC_PIPE_DEBUG=1 for a traceback)", 1)
    return code
