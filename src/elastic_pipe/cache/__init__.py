"""AutoCache: a tiered cache of the frozen prefix's output activations (device, shared host memory, disk),
keyed by (sample id, frozen boundary), with budgets, boundary moves and a pay-off decision.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
