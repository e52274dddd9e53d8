"""The result of every solver: a contiguous assignment of layers to pipeline stages."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from elastic_pipe.partition.errors import PartitionError

__all__ = ["Partition", "stage_sums"]


def stage_sums(costs: list[float], layers_per_stage: tuple[int, ...]) -> tuple[float, ...]:
    """Sum ``costs`` over each stage of a contiguous partition (an empty stage sums to 0)."""
    bounds = [0, *itertools.accumulate(layers_per_stage)]
    return tuple(float(sum(costs[b:e])) for b, e in itertools.pairwise(bounds))


@dataclass(frozen=True, slots=True)
class Partition:
    """Layers ``0..n-1`` cut into ``K`` contiguous stages.

    Attributes:
        layers_per_stage: number of layers on each stage, in stage order. Every solver returns non-empty stages;
            only the published ``greedy`` rule with ``allow_empty=True`` may return a 0.
        stage_costs: cost of each stage under the solver's cost model, in the unit of the input costs.
        solver: name of the solver that produced it.
        solve_seconds: wall time of the solver alone (no validation, no I/O).
    """

    layers_per_stage: tuple[int, ...]
    stage_costs: tuple[float, ...]
    solver: str
    solve_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.layers_per_stage:
            raise PartitionError("Partition needs at least one stage, got layers_per_stage=()")
        if any(not isinstance(c, int) or c < 0 for c in self.layers_per_stage):
            raise PartitionError(f"Partition.layers_per_stage must be ints >= 0, got {self.layers_per_stage!r}")
        if len(self.stage_costs) != len(self.layers_per_stage):
            raise PartitionError(
                f"Partition has {len(self.layers_per_stage)} stages but {len(self.stage_costs)} stage costs"
            )

    @property
    def num_stages(self) -> int:
        """K, the number of stages."""
        return len(self.layers_per_stage)

    @property
    def num_layers(self) -> int:
        """n, the number of layers covered."""
        return sum(self.layers_per_stage)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """K + 1 offsets starting at 0: stage ``s`` holds layers ``boundaries[s]:boundaries[s+1]``."""
        return (0, *itertools.accumulate(self.layers_per_stage))

    @property
    def bottleneck(self) -> float:
        """The largest stage cost (what the pipeline's throughput is bound by)."""
        return max(self.stage_costs)

    def stage_of(self, layer: int) -> int:
        """The stage holding ``layer`` (0-based).

        Raises:
            PartitionError: if ``layer`` is outside ``0..num_layers-1``.
        """
        if not 0 <= layer < self.num_layers:
            raise PartitionError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        for stage, end in enumerate(self.boundaries[1:]):
            if layer < end:
                return stage
        raise AssertionError("unreachable: boundaries cover every layer")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's output keys)."""
        return {
            "solver": self.solver,
            "layers_per_stage": list(self.layers_per_stage),
            "boundaries": list(self.boundaries),
            "stage_costs": list(self.stage_costs),
            "bottleneck": self.bottleneck,
            "solve_seconds": self.solve_seconds,
        }
