"""Elastic data: a deterministic distributed sampler that re-shards mid-epoch without losing or repeating a sample,
and real datasets that ship inside PyPI packages (digits, MNIST 5k) with sample ids.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
