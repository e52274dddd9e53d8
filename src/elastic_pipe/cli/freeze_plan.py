"""Print the frozen-layer count per epoch of a schedule-driven freeze policy.

Reserved: not built yet.
"""

from __future__ import annotations

import argparse

from elastic_pipe.cli._common import add_json_flag, not_built

HELP = "Print the frozen-layer count per epoch of a schedule-driven freeze policy. (not built yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Report that the subcommand is not built yet."""
    return not_built("freeze-plan", "the freeze issue")
