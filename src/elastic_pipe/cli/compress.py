"""Find the smallest pipeline length that still fits after freezing.

Reserved: not built yet.
"""

from __future__ import annotations

import argparse

from elastic_pipe.cli._common import add_json_flag, not_built

HELP = "Find the smallest pipeline length that still fits after freezing. (not built yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Report that the subcommand is not built yet."""
    return not_built("compress", "the partition issue")
