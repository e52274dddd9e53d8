"""``SubLayerModel``: a model as an ordered list of one-tensor-in, one-tensor-out sub-layers.

Pipeline parallelism cuts a model between layers, and the frozen prefix's output is cached per sample. Both are
only simple when every cut point carries exactly one tensor, so every model in this package is an
``nn.Sequential`` whose children each take one tensor and return one tensor. A transformer block is two
sub-layers (attention with its residual, MLP with its residual), so a partitioner may cut inside a block.

Freezing works on *units* (transformer blocks), not on sub-layers: ``unit_ends[k]`` is the sub-layer offset just
past unit ``k``. The embedding belongs to unit 0 and the head to no unit, so freezing ``k`` units freezes
sub-layers ``[0, unit_ends[k - 1])`` and the head always trains.
"""

from __future__ import annotations

import builtins
import itertools
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Protocol, overload

from torch import nn

from elastic_pipe.models._checks import MAX_DEPTH
from elastic_pipe.models.errors import CHECK, ModelError, ModelTypeError
from elastic_pipe.types import MAX_DIMENSION

__all__ = ["SubLayerInit", "SubLayerModel", "block_unit_ends"]


class SubLayerInit(Protocol):
    """Writes the initial values of sub-layer ``index``'s tensors named ``keys``.

    ``keys`` are state-dict keys of the whole model, all inside sub-layer ``index``; their tensors already have
    storage (uninitialized). The values must depend only on ``index`` (and the recipe), never on which other
    sub-layers this process holds.
    """

    def __call__(self, model: SubLayerModel, index: int, keys: Collection[str]) -> None: ...


class SubLayerModel(nn.Sequential):
    """An ordered list of named sub-layers plus the unit (block) structure that freezing uses.

    Args:
        layers: ``(name, module)`` pairs in execution order; each module maps one tensor to one tensor.
        unit_ends: strictly increasing sub-layer offsets, one per freezable unit; the last one must leave at
            least one sub-layer (the head) after it.

    Set :attr:`sublayer_init` on a model built on the meta device so that each rank can give the sub-layers it
    holds their values (:mod:`elastic_pipe.models.weights`); the built-in builders set it.

    Raises:
        ModelError: if names repeat, ``unit_ends`` is not strictly increasing within ``[1, len(layers) - 1]``.
    """

    unit_ends: tuple[int, ...]
    #: How a sub-layer on the meta device gets its values when it is materialized
    #: (:func:`elastic_pipe.models.weights.materialize_sublayers`); ``None`` for a model built with real weights.
    sublayer_init: SubLayerInit | None

    def __init__(self, layers: Sequence[tuple[str, nn.Module]], unit_ends: Sequence[int]) -> None:
        layers = CHECK.items("layers", layers, empty=True)
        for index, pair in enumerate(layers):
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], nn.Module)):
                raise ModelTypeError(f"layers[{index}] must be a (name, module) pair, got {pair!r}")
        unit_ends = CHECK.ints("unit_ends", unit_ends, empty=True)
        names = [name for name, _ in layers]
        if len(set(names)) != len(names):
            raise ModelError(f"sub-layer names must be unique, got {names!r}")
        ends = tuple(int(e) for e in unit_ends)
        if not ends:
            raise ModelError("a SubLayerModel needs at least one freezable unit, got unit_ends=()")
        if ends[0] < 1 or ends[-1] > len(layers) - 1 or any(a >= b for a, b in itertools.pairwise(ends)):
            raise ModelError(
                f"unit_ends must strictly increase within [1, {len(layers) - 1}] (the head is in no unit) "
                f"for {len(layers)} sub-layers, got {ends!r}"
            )
        super().__init__()
        for name, module in layers:
            # nn.Module attribute names cannot hold dots; "block0.attn" is stored as "block0_attn".
            self.add_module(name.replace(".", "_"), module)
        self.unit_ends = ends
        self.sublayer_init = None
        self.layer_names: tuple[str, ...] = tuple(names)

    @property
    def num_units(self) -> int:
        """Number of freezable units (transformer blocks)."""
        return len(self.unit_ends)

    @property
    def num_sublayers(self) -> int:
        """Number of sub-layers, head included."""
        return len(self)

    def named_sublayers(self) -> list[tuple[str, nn.Module]]:
        """``(name, module)`` pairs in execution order (the shape ``partition.profile_layers`` takes)."""
        return list(zip(self.layer_names, self, strict=True))

    def prefix_len(self, frozen_units: int) -> int:
        """Number of leading sub-layers that freezing ``frozen_units`` units freezes.

        Raises:
            ModelError: if ``frozen_units`` is outside ``[0, num_units]``.
        """
        if not 0 <= frozen_units <= self.num_units:
            raise ModelError(f"frozen_units must be in [0, {self.num_units}], got {frozen_units!r}")
        return 0 if frozen_units == 0 else self.unit_ends[frozen_units - 1]

    def unit_of(self, index: int) -> int | None:
        """The unit that sub-layer ``index`` belongs to, or ``None`` for the head.

        Raises:
            ModelError: if ``index`` is not a sub-layer index.
        """
        self._check_index(index)
        for unit, end in enumerate(self.unit_ends):
            if index < end:
                return unit
        return None

    def unit_bounds(self, unit: int) -> tuple[int, int]:
        """``(start, end)`` sub-layer offsets of ``unit``.

        Raises:
            ModelError: if ``unit`` is outside ``[0, num_units)``.
        """
        if not 0 <= unit < self.num_units:
            raise ModelError(f"unit must be in [0, {self.num_units}), got {unit!r}")
        start = 0 if unit == 0 else self.unit_ends[unit - 1]
        return start, self.unit_ends[unit]

    def unit_modules(self, unit: int) -> list[nn.Module]:
        """The sub-layer modules of ``unit`` (what a freeze applies to)."""
        start, end = self.unit_bounds(unit)
        return list(self[start:end])

    def slice(self, start: int, end: int) -> nn.Sequential:
        """Sub-layers ``[start, end)`` as a plain ``nn.Sequential`` sharing this model's modules.

        Raises:
            ModelError: unless ``0 <= start < end <= num_sublayers``.
        """
        if not 0 <= start < end <= len(self):
            raise ModelError(f"slice needs 0 <= start < end <= {len(self)}, got start={start!r}, end={end!r}")
        return self[start:end]

    def head_start(self) -> int:
        """Offset of the first sub-layer that belongs to no unit (the head)."""
        return self.unit_ends[-1]

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self):
            raise ModelError(f"sub-layer index must be in [0, {len(self)}), got {index!r}")

    @overload
    def __getitem__(self, idx: builtins.slice) -> nn.Sequential: ...

    @overload
    def __getitem__(self, idx: int) -> nn.Module: ...

    def __getitem__(self, idx: int | builtins.slice) -> nn.Module:
        # nn.Sequential rebuilds slices with ``self.__class__``, whose constructor here needs unit_ends; a slice of
        # sub-layers has no unit structure, so it is a plain Sequential (sharing the modules).
        if isinstance(idx, builtins.slice):
            return nn.Sequential(OrderedDict(list(self._modules.items())[idx]))
        return super().__getitem__(idx)

    def extra_repr(self) -> str:
        return f"unit_ends={self.unit_ends}"


def block_unit_ends(depth: int, embed_layers: int = 1, sublayers_per_block: int = 2) -> tuple[int, ...]:
    """Unit ends for ``embed, (attn, mlp) * depth, head``: unit 0 holds the embedding and block 0.

    Example: ``block_unit_ends(3) == (3, 5, 7)`` for ``embed, b0.attn, b0.mlp, b1.attn, b1.mlp, b2.attn, b2.mlp,
    head``.
    """
    CHECK.int("depth", depth, hi=MAX_DEPTH)
    CHECK.int("embed_layers", embed_layers, hi=MAX_DIMENSION)
    CHECK.int("sublayers_per_block", sublayers_per_block, hi=MAX_DIMENSION)
    return tuple(embed_layers + sublayers_per_block * (i + 1) for i in range(depth))
