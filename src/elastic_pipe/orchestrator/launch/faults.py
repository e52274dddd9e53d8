"""Fault injection for the restart tests: a rank exits hard (or stops) where ``ELASTIC_PIPE_FAULT`` says, on a first
attempt."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

__all__ = ["FAULT_ACTION_ENV", "FAULT_ENV", "maybe_fail"]

log = logging.getLogger(__name__)

#: Fault injection for the resume tests: ``"<where>:<rank>:<epoch>[:<step>]"`` with where in "step",
#: "transition" (before a transition's first move) or "moved" (after its moves, before the rest of it); the rank
#: exits hard there, on the first attempt of a torchrun job only.
FAULT_ENV = "ELASTIC_PIPE_FAULT"
#: What the rank does there: "exit" (the default: ``os._exit(1)``) or "stop" (SIGSTOP to itself: a silent peer that
#: neither exits nor answers, for the tests of how one is named).
FAULT_ACTION_ENV = "ELASTIC_PIPE_FAULT_ACTION"


def maybe_fail(where: str, rank: int, epoch: int, step: int | None) -> None:
    """Exit hard where :data:`FAULT_ENV` says (first torchrun attempt only): the resume tests' fault injection."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    parts = spec.split(":")
    if parts[0] != where or int(parts[1]) != rank or int(parts[2]) != epoch:
        return
    if step is not None and len(parts) > 3 and int(parts[3]) != step:
        return
    action = os.environ.get(FAULT_ACTION_ENV, "exit")
    # the wall-clock time lets a test measure how long the launcher took to name the rank
    log.warning(
        "fault injection (%s): rank %d %ss at epoch %d step %s (time %.3f)",
        spec,
        rank,
        action,
        epoch,
        step,
        time.time(),
    )
    sys.stderr.flush()
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    os._exit(1)
