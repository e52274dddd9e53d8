"""Partition layer costs into K contiguous pipeline stages.

Reserved: not built yet.
"""

from __future__ import annotations

import argparse

from elastic_pipe.cli._common import add_json_flag, not_built

HELP = "Partition layer costs into K contiguous pipeline stages. (not built yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Report that the subcommand is not built yet."""
    return not_built("partition", "the partition issue")
