"""The run's position: one frozen record, replaced (never mutated) at every step boundary that matters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from elastic_pipe.types import Layout

__all__ = ["RunState", "layout_from_dict", "layout_to_dict"]


@dataclass(frozen=True)
class RunState:
    """Where a run stands.

    Attributes:
        layout: the current layout.
        budget: the bottleneck cost of the initial partition, which compression must respect.
        frozen_units: freezable units frozen now.
        epoch: the epoch about to run or running (0-based).
        step: optimizer steps completed in the whole run.
        decision_due: a decision point was reached and its decision not made yet: after an epoch's end until the
            transition runs, and at a decision point where ``[train] max_steps`` stopped the run; a run resumed
            from such a state decides first.
    """

    layout: Layout
    budget: float
    frozen_units: int = 0
    epoch: int = 0
    step: int = 0
    decision_due: bool = False

    def replace(self, **changes: Any) -> RunState:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what a checkpoint stores)."""
        return {
            "layout": layout_to_dict(self.layout),
            "budget": self.budget,
            "frozen_units": self.frozen_units,
            "epoch": self.epoch,
            "step": self.step,
            "decision_due": self.decision_due,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], world_size: int) -> RunState:
        """The inverse of :meth:`to_dict`, in a job of ``world_size`` ranks (the replica count follows)."""
        return cls(
            layout=layout_from_dict(d["layout"], world_size),
            budget=float(d["budget"]),
            frozen_units=int(d["frozen_units"]),
            epoch=int(d["epoch"]),
            step=int(d["step"]),
            decision_due=bool(d.get("decision_due", False)),
        )


def layout_to_dict(layout: Layout) -> dict[str, Any]:
    """A layout as plain data; the replica count is left out (it follows from the world size)."""
    return {
        "frozen": layout.frozen,
        "pipe_len": layout.pipe_len,
        "boundaries": list(layout.boundaries),
        "microbatches": layout.microbatches,
    }


def layout_from_dict(d: dict[str, Any], world_size: int) -> Layout:
    """The inverse of :func:`layout_to_dict` for ``world_size`` ranks."""
    pipe_len = int(d["pipe_len"])
    return Layout(
        int(d["frozen"]),
        pipe_len,
        world_size // pipe_len,
        tuple(int(b) for b in d["boundaries"]),
        int(d["microbatches"]),
    )
