"""Pipeline schedules as data: an action IR, generators (GPipe, 1F1B, interleaved, zero-bubble), a validator,
an event-driven simulator, micro-batch tuning, Gantt charts and lowering to torch.distributed.pipelining.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
