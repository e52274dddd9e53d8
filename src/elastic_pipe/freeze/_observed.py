"""Gradient-statistics bookkeeping shared by the statistics-driven policies (:class:`AutoFreeze`,
:class:`PaperRule`): checking what ``observe`` receives, and per-layer norms in and out of a snapshot (internal).
"""

from __future__ import annotations

from typing import Any

from elastic_pipe.freeze.errors import FreezeError
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["check_stats", "norms_from_state", "norms_to_state"]


def check_stats(owner: str, num_layers: int, stats: LayerStats) -> None:
    """Raise FreezeError unless ``stats`` covers ``num_layers`` layers over at least one step."""
    if stats.num_layers != num_layers or stats.steps < 1:
        raise FreezeError(
            f"{owner}.observe: got stats of {stats.num_layers} layers over {stats.steps} steps, "
            f"expected {num_layers} layers over >= 1 step"
        )


def norms_to_state(norms: tuple[float, ...] | None) -> list[float] | None:
    """Per-layer norms (or none yet) as plain JSON."""
    return None if norms is None else list(norms)


def norms_from_state(value: Any) -> tuple[float, ...] | None:
    """Inverse of :func:`norms_to_state`."""
    return None if value is None else tuple(float(v) for v in value)
