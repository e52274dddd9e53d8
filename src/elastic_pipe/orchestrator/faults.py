"""Fault injection for the restart tests: a rank exits hard where ``ELASTIC_PIPE_FAULT`` says, on a first attempt."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["FAULT_ENV", "maybe_fail"]

log = logging.getLogger(__name__)

#: Fault injection for the resume tests: ``"<where>:<rank>:<epoch>[:<step>]"`` with where in "step",
#: "transition" (before a transition's first move) or "moved" (after its moves, before the rest of it); the rank
#: exits hard there, on the first attempt of a torchrun job only.
FAULT_ENV = "ELASTIC_PIPE_FAULT"


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
    log.warning("fault injection (%s): rank %d exits at epoch %d step %s", spec, rank, epoch, step)
    sys.stderr.flush()
    os._exit(1)
