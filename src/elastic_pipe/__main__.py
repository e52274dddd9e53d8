"""``python -m elastic_pipe`` runs the command-line interface."""

from __future__ import annotations

import sys

from elastic_pipe.cli import main

if __name__ == "__main__":
    sys.exit(main())
