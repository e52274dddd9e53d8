"""Per-layer gradient statistics over an interval, and the pure merge of per-stage pieces.

A :class:`LayerStats` is indexed by *global* layer index (layer 0 is the first freezable layer of the whole model),
so that every pipeline stage can report the layers it holds in the same coordinates and the orchestrator can merge
the pieces with :func:`merge_stats` after gathering them (for instance with :meth:`LayerStats.to_tensor` and an
``all_gather``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from elastic_pipe.freeze.errors import CHECK, FreezeError

__all__ = ["LayerStats", "merge_stats"]


@dataclass(frozen=True, slots=True)
class LayerStats:
    """Norms of each layer's gradient accumulated (summed) over ``steps`` optimizer steps.

    Attributes:
        l1: per layer, the L1 norm of the summed gradient (sum of absolute values over the layer's parameters).
        l2: per layer, the L2 norm of the summed gradient (over all of the layer's parameters together).
        steps: number of steps accumulated; a layer that no rank holds (or a frozen one) reads 0.
    """

    l1: tuple[float, ...]
    l2: tuple[float, ...]
    steps: int

    def __post_init__(self) -> None:
        CHECK.items("LayerStats.l1", self.l1, empty=True)
        CHECK.items("LayerStats.l2", self.l2, empty=True)
        CHECK.int("LayerStats.steps", self.steps)
        if len(self.l1) != len(self.l2):
            raise FreezeError(f"LayerStats needs l1 and l2 of equal length, got {len(self.l1)} and {len(self.l2)}")
        if self.steps < 0:
            raise FreezeError(f"LayerStats.steps must be >= 0, got {self.steps}")
        for name, values in (("l1", self.l1), ("l2", self.l2)):
            for i, v in enumerate(values):
                if not math.isfinite(CHECK.number(f"LayerStats.{name}[{i}]", v)) or v < 0:
                    raise FreezeError(f"LayerStats.{name}[{i}] must be a finite number >= 0, got {v!r}")

    @property
    def num_layers(self) -> int:
        """Number of layers the statistics cover."""
        return len(self.l1)

    @classmethod
    def zeros(cls, num_layers: int, steps: int = 0) -> LayerStats:
        """Statistics of ``num_layers`` layers that all read 0."""
        return cls((0.0,) * num_layers, (0.0,) * num_layers, steps)

    def mean_l1(self) -> tuple[float, ...]:
        """L1 norm of the *mean* gradient per layer (``l1 / steps``), comparable across intervals of any length."""
        return tuple(v / self.steps for v in self.l1) if self.steps else self.l1

    def mean_l2(self) -> tuple[float, ...]:
        """L2 norm of the *mean* gradient per layer (``l2 / steps``)."""
        return tuple(v / self.steps for v in self.l2) if self.steps else self.l2

    def to_tensor(self) -> torch.Tensor:
        """Flatten to a float64 tensor ``[steps, l1..., l2...]`` (length ``1 + 2 * num_layers``) for collectives."""
        return torch.tensor([float(self.steps), *self.l1, *self.l2], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, flat: torch.Tensor) -> LayerStats:
        """Inverse of :meth:`to_tensor`.

        Raises:
            FreezeError: the tensor is not 1-D of odd length, or ``steps`` is not a whole number.
        """
        values = [float(v) for v in flat.detach().to(torch.float64).flatten().tolist()]
        if flat.dim() != 1 or len(values) % 2 != 1:
            raise FreezeError(f"LayerStats.from_tensor needs a 1-D tensor of odd length, got shape {tuple(flat.shape)}")
        steps = values[0]
        if steps != int(steps):
            raise FreezeError(f"LayerStats.from_tensor: steps must be a whole number, got {steps!r}")
        n = (len(values) - 1) // 2
        return cls(tuple(values[1 : 1 + n]), tuple(values[1 + n :]), int(steps))


def merge_stats(pieces: Sequence[LayerStats]) -> LayerStats:
    """Merge per-stage statistics that cover disjoint sets of parameters into one per-layer vector.

    Each stage reports the layers it holds and zeros elsewhere. A layer may even be split between two stages (a
    block's attention on one, its MLP on the next): L1 norms of disjoint parameter sets add, L2 norms combine as
    the root of the sum of squares, so the merge is exact in both cases. Do not merge data-parallel replicas of the
    same stage (their gradients are already all-reduced, so any one replica's piece stands for all of them).

    Args:
        pieces: one :class:`LayerStats` per stage, all with the same ``num_layers`` and ``steps``.

    Returns:
        The merged statistics.

    Raises:
        FreezeError: no pieces, or pieces that disagree on the number of layers or steps.
    """
    pieces = CHECK.items("merge_stats: pieces", pieces, empty=True)
    if not pieces:
        raise FreezeError("merge_stats needs at least one piece, got none")
    for i, piece in enumerate(pieces):
        CHECK.instance(f"merge_stats: pieces[{i}]", piece, LayerStats)
    n, steps = pieces[0].num_layers, pieces[0].steps
    for i, p in enumerate(pieces):
        if p.num_layers != n or p.steps != steps:
            raise FreezeError(
                f"merge_stats: piece {i} covers {p.num_layers} layers over {p.steps} steps, "
                f"expected {n} layers over {steps} steps like piece 0"
            )
    l1 = tuple(math.fsum(p.l1[i] for p in pieces) for i in range(n))
    l2 = tuple(math.sqrt(math.fsum(p.l2[i] ** 2 for p in pieces)) for i in range(n))
    return LayerStats(l1, l2, steps)
