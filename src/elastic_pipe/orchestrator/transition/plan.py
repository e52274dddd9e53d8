"""Moving state between ranks when the layout changes: who holds which sub-layers, who sends what to whom.

Each rank holds only the sub-layers it runs (:func:`held_sublayers`): its stage's active sub-layers and, on
stage-0 ranks, the frozen prefix (stage 0 runs it, or fills the activation cache with it). The other sub-layers
sit on the meta device and take no memory (:mod:`elastic_pipe.models.residency`). A transition therefore sends a
sub-layer only to the ranks that need it in the new layout and lack it in the old one:

* a sub-layer a rank starts to hold comes from one old holder (its stage's replica copies are identical after the
  gradient all-reduce; a frozen sub-layer's copies never change), weights and buffers always, and its optimizer
  state too while it stays active;
* a sub-layer a rank stops holding is freed there, after every transfer is done.

The plan (:func:`plan_transfers`) is a pure function of the two layouts, so every rank computes the same list.
Each :class:`Transfer` is one point-to-point exchange (``torch.distributed.send``/``recv``: NCCL on GPU, gloo on
CPU), run by both ends in the plan's order: the earliest unfinished transfer always has both ends waiting on it, so
the sequence cannot deadlock. The exchanges themselves (tensors as one flat buffer per dtype, the optimizer-state
metadata as an encoded :class:`~elastic_pipe.protocol.OptimizerStateHeader` over the gloo control group; nothing
through files, nothing pickled) are :mod:`.moves`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from elastic_pipe.orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from elastic_pipe.types import Layout

__all__ = ["RankLayout", "Transfer", "changed_ranks", "held_sublayers", "owned_sublayers", "plan_transfers"]


class RankLayout(Protocol):
    """The part of :class:`elastic_pipe.groups.RankPlan` a transition reads."""

    @property
    def pipeline_groups(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]: ...

    def stage_of(self, rank: int) -> int: ...

    def replica_of(self, rank: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Transfer:
    """Sub-layers that rank ``src`` sends to rank ``dst``.

    Attributes:
        src: global rank holding a current copy.
        dst: global rank that holds them in the new layout and lacks them in the old one.
        sublayers: sub-layer indices, increasing.
        optimizer_state: whether their optimizer state travels too (they stay active) or only weights (frozen).
    """

    src: int
    dst: int
    sublayers: tuple[int, ...]
    optimizer_state: bool


def _position_sublayers(layout: Layout) -> list[range | tuple[int, ...]]:
    """The active sub-layers of each pipeline position (rank of a replica): one stage's range with one stage per
    rank, the layers of its stages (:meth:`~elastic_pipe.types.Layout.placement`, loop style) with several."""
    b = layout.boundaries
    if layout.virtual == 1:
        return [range(b[s], b[s + 1]) for s in range(layout.pipe_len)]
    placement = layout.placement()
    return [tuple(j for lo, hi in placement.ranges_of(p) for j in range(lo, hi)) for p in range(layout.pipe_len)]


def owned_sublayers(layout: Layout, plan: RankLayout, rank: int) -> range | tuple[int, ...]:
    """The sub-layers ``rank`` holds (and trains) under ``layout``: a range with one stage per rank, the layers of
    its stages, increasing, with several."""
    return _position_sublayers(layout)[plan.stage_of(rank)]


def held_sublayers(layout: Layout, plan: RankLayout, rank: int) -> tuple[int, ...]:
    """The sub-layers ``rank`` keeps in memory under ``layout``: its stage's, plus the frozen prefix on stage 0."""
    own = owned_sublayers(layout, plan, rank)
    prefix = range(layout.frozen) if plan.stage_of(rank) == 0 else range(0)
    return (*prefix, *own)


def _holders(layout: Layout, plan: RankLayout, num_sublayers: int) -> list[tuple[int, ...]]:
    """For each sub-layer, the ranks holding it under ``layout`` (increasing)."""
    holders: list[list[int]] = [[] for _ in range(num_sublayers)]
    for position, sublayers in enumerate(_position_sublayers(layout)):
        for j in sublayers:
            holders[j].extend(plan.dp_groups[position])
    for j in range(layout.frozen):
        holders[j].extend(plan.dp_groups[0])
    return [tuple(sorted(set(h))) for h in holders]


def plan_transfers(
    old: Layout, new: Layout, old_plan: RankLayout, new_plan: RankLayout, *, released: int = 0
) -> tuple[Transfer, ...]:
    """What must travel, and between whom, for the job to go from ``old`` to ``new``.

    Every rank that holds a sub-layer under ``new`` and did not under ``old`` receives it from one old holder:
    the one in its own old replica's pipeline when there is one (so the old replicas share the sending), else the
    lowest-ranked old holder.

    Args:
        old: the layout being left.
        new: the layout being entered (``new.frozen >= old.frozen``: frozen layers never thaw here).
        old_plan: rank roles under ``old`` (``groups.plan_spmd(world, old.pipe_len)``).
        new_plan: rank roles under ``new``.
        released: leading sub-layers whose weights the stage-0 ranks released while the activation cache serves
            them (:mod:`.prefix.residency`; at most ``old.frozen``): they travel to no one, since the new stage-0
            ranks fill their cache from the old boundary's entries without them.

    Returns:
        Transfers ordered by (source, destination); sub-layers increasing within each.

    Raises:
        OrchestratorError: if ``new`` thaws layers, the layouts cover different models, or ``released`` exceeds
            ``old.frozen``.
    """
    if not 0 <= released <= old.frozen:
        raise OrchestratorError(f"released must lie in [0, {old.frozen}] (the old frozen prefix), got {released}")
    if new.frozen < old.frozen:
        raise OrchestratorError(f"a transition cannot unfreeze layers: frozen {old.frozen} -> {new.frozen}")
    n = old.boundaries[-1]
    if n != new.boundaries[-1]:
        raise OrchestratorError(f"layouts cover different models: {n} vs {new.boundaries[-1]} sub-layers")
    had, has = _holders(old, old_plan, n), _holders(new, new_plan, n)
    pairs: dict[tuple[int, int, bool], list[int]] = {}
    for j in range(released, n):
        for dst in has[j]:
            if dst in had[j]:
                continue
            mates = set(old_plan.pipeline_groups[old_plan.replica_of(dst)])
            src = min((r for r in had[j] if r in mates), default=had[j][0])
            pairs.setdefault((src, dst, j >= new.frozen), []).append(j)
    return tuple(
        Transfer(src, dst, tuple(sublayers), optimizer_state=active)
        for (src, dst, active), sublayers in sorted(pairs.items())
    )


def changed_ranks(old_plan: RankLayout, new_plan: RankLayout, world_size: int) -> tuple[int, ...]:
    """Ranks whose (replica, stage) role differs between the two plans."""
    return tuple(
        r
        for r in range(world_size)
        if (old_plan.stage_of(r), old_plan.replica_of(r)) != (new_plan.stage_of(r), new_plan.replica_of(r))
    )


# ------------------------------------------------------------------------------------------- point to point
