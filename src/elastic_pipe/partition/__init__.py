"""Partition solvers: per-layer cost models, contiguous stage partitions (uniform, greedy, optimal, graph),
pipeline compression and a profiler that measures real modules into cost records.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
