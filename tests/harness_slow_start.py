"""A module that takes a while to import when asked to: a rank spawned to run :func:`rank_number` starts slowly,
as a rank does on a loaded machine (spawning, importing torch). Used by tests/test_harness.py."""

from __future__ import annotations

import os
import time

from elastic_pipe.testing import RankContext

#: Seconds an import of this module sleeps (unset: none).
DELAY_ENV = "ELASTIC_PIPE_TEST_START_DELAY"

time.sleep(float(os.environ.get(DELAY_ENV) or 0))


def rank_number(ctx: RankContext) -> int:
    return ctx.rank
