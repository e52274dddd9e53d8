"""Freeze policies: decide how many leading layers are frozen, collect per-layer gradient statistics,
and apply a decision to a model and its optimizer without disturbing the state of active parameters.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

__all__: list[str] = []
