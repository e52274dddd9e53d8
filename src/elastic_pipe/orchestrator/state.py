"""The run's position: one frozen record, replaced (never mutated) at every step boundary that matters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NotRequired, TypedDict, Unpack

from elastic_pipe.types import Layout

__all__ = ["LayoutRecord", "RunState", "RunStateRecord", "layout_from_dict", "layout_to_dict"]


class LayoutRecord(TypedDict):
    """A layout as plain data (:func:`layout_to_dict`); the replica count follows from the world size, and
    ``virtual`` is there only when it is not 1 (a record of one stage per rank is the one written before virtual
    stages)."""

    frozen: int
    pipe_len: int
    boundaries: list[int]
    microbatches: int
    virtual: NotRequired[int]


class RunStateRecord(TypedDict):
    """A :class:`RunState` as plain data (:meth:`RunState.to_dict`); older checkpoints lack ``decision_due``."""

    layout: LayoutRecord
    budget: float
    frozen_units: int
    epoch: int
    step: int
    decision_due: NotRequired[bool]


class _Changes(TypedDict, total=False):
    """The fields :meth:`RunState.replace` may change."""

    layout: Layout
    budget: float
    frozen_units: int
    epoch: int
    step: int
    decision_due: bool


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

    def replace(self, **changes: Unpack[_Changes]) -> RunState:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> RunStateRecord:
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
    def from_dict(cls, d: RunStateRecord, world_size: int) -> RunState:
        """The inverse of :meth:`to_dict`, in a job of ``world_size`` ranks (the replica count follows)."""
        return cls(
            layout=layout_from_dict(d["layout"], world_size),
            budget=float(d["budget"]),
            frozen_units=int(d["frozen_units"]),
            epoch=int(d["epoch"]),
            step=int(d["step"]),
            decision_due=bool(d.get("decision_due", False)),
        )


def layout_to_dict(layout: Layout) -> LayoutRecord:
    """A layout as plain data; the replica count is left out (it follows from the world size), and so is
    ``virtual`` when it is 1."""
    record: LayoutRecord = {
        "frozen": layout.frozen,
        "pipe_len": layout.pipe_len,
        "boundaries": list(layout.boundaries),
        "microbatches": layout.microbatches,
    }
    if layout.virtual != 1:
        record["virtual"] = layout.virtual
    return record


def layout_from_dict(d: LayoutRecord, world_size: int) -> Layout:
    """The inverse of :func:`layout_to_dict` for ``world_size`` ranks."""
    pipe_len = int(d["pipe_len"])
    return Layout(
        int(d["frozen"]),
        pipe_len,
        world_size // pipe_len,
        tuple(int(b) for b in d["boundaries"]),
        int(d["microbatches"]),
        int(d.get("virtual", 1)),
    )
