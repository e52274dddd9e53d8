"""Run elastic training from a TOML config (torchrun underneath).

Reserved: not built yet.
"""

from __future__ import annotations

import argparse

from elastic_pipe.cli._common import add_json_flag, not_built

HELP = "Run elastic training from a TOML config (torchrun underneath). (not built yet)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the subcommand's options."""
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    """Report that the subcommand is not built yet."""
    return not_built("train", "the elastic training issue")
