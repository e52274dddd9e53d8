"""The compression rules: the pipeline length once a frozen prefix has left the pipeline, with its partition.

A compression rule gets the active sub-layers' costs, the current length, the budget (the bottleneck cost of the
initial partition) and the world size, and returns the new length with its partition (its ``num_stages``):

* ``halving`` - the published rule: halve while the halved pipeline still fits the budget;
* ``memory`` - the shortest length dividing the current one whose partition fits the budget;
* ``none`` - keep the length (freeze only; the pipeline needs one active sub-layer per stage).

An object with ``name``, ``keeps_length`` and this ``__call__`` is a rule (``[pipeline] compression`` takes a
built-in's name or the ``"module:attr"`` of one). :mod:`.rule` applies the rule a run is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from elastic_pipe import partition as part

__all__ = ["COMPRESSION_RULES", "CompressionRule", "Halving", "KeepLength", "MemoryFit", "Solver"]

#: A partition solver: a name (``"optimal"``) or a function (:data:`elastic_pipe.partition.Solver`).
Solver = str | part.Solver


@runtime_checkable
class CompressionRule(Protocol):
    """Chooses the pipeline length once the frozen prefix has left the pipeline.

    Attributes:
        name: a short name ("halving", "memory", "none").
        keeps_length: whether the rule never shortens the pipeline (then freezing stops one sub-layer per stage
            short of the end).
    """

    @property
    def name(self) -> str: ...

    @property
    def keeps_length(self) -> bool: ...

    def __call__(
        self, active: Sequence[float], pipe_len: int, budget: float, *, world_size: int, solver: Solver
    ) -> part.Partition:
        """The partition of the ``active`` costs at the chosen length (its ``num_stages``)."""
        ...


@dataclass(frozen=True)
class Halving:
    """The published rule: :func:`elastic_pipe.partition.compress_halving`."""

    name: str = "halving"
    keeps_length: bool = False

    def __call__(
        self, active: Sequence[float], pipe_len: int, budget: float, *, world_size: int, solver: Solver
    ) -> part.Partition:
        return part.compress_halving(active, pipe_len, budget, solver=solver).partition


@dataclass(frozen=True)
class MemoryFit:
    """The shortest length dividing the current one that fits: :func:`elastic_pipe.partition.compress_memory`.

    Only divisors of the current length are tried: a pipeline shrinks onto its own devices, never grows.
    """

    name: str = "memory"
    keeps_length: bool = False

    def __call__(
        self, active: Sequence[float], pipe_len: int, budget: float, *, world_size: int, solver: Solver
    ) -> part.Partition:
        return part.compress_memory(active, pipe_len, budget, solver=solver).partition


@dataclass(frozen=True)
class KeepLength:
    """No reshaping: re-partition the active layers over the same number of stages."""

    name: str = "none"
    keeps_length: bool = True

    def __call__(
        self, active: Sequence[float], pipe_len: int, budget: float, *, world_size: int, solver: Solver
    ) -> part.Partition:
        return part.solve(list(active), pipe_len, solver)


#: The built-in rules by the names ``[pipeline] compression`` accepts.
COMPRESSION_RULES: dict[str, CompressionRule] = {"halving": Halving(), "memory": MemoryFit(), "none": KeepLength()}
