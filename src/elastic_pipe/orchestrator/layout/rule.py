"""The layout rule: from sub-layer costs and a frozen count to the next :class:`Layout`, in one place.

The trainer (at every decision point) and the planner (``elastic-pipe plan --config``) both call these pure
functions, so a plan predicts exactly the layouts a run performs. The partition comes from
:func:`elastic_pipe.partition.solve`, the shorter pipeline from a :class:`~.compression.CompressionRule`
(:mod:`.compression`: ``halving``, ``memory``, ``none``).

A per-rank memory budget (:class:`~.start.MemoryBudget`, from ``[pipeline] memory_budget``) bounds every
layout on top of that: the initial length is the shortest that fits it
(:func:`~.start.initial_layout_within`), and when a rule's choice does not fit, :func:`next_layout` takes the
shortest longer length, up to the current one, that does. The first layout of a run: :mod:`.start`.

With several stages per rank (``[pipeline] virtual`` = v > 1, interleaved schedules) the rule chooses the number
of ranks K as with one (the compression rule and the budget see each rank's share of the layers as one block),
then partitions the active sub-layers over ``K * v`` stages, placed in loop style
(:meth:`~elastic_pipe.types.Layout.placement`). A fixed v is kept through every transition; with
``virtual = "auto"`` (:class:`~.virtual_choice.AutoVirtual`) every layout made (the first, each transition's, a
resume's) gets the v :func:`~.virtual_choice.choose_virtual` picks for its K, micro-batches and active sub-layers,
so v may change at a transition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from elastic_pipe import freeze
from elastic_pipe import partition as part
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.layout.start import start_layout
from elastic_pipe.orchestrator.layout.virtual_choice import AutoVirtual, stages_per_rank
from elastic_pipe.types import Layout

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.layout.compression import CompressionRule, Solver
    from elastic_pipe.orchestrator.layout.start import MemoryBudget

__all__ = ["decide_units", "frozen_sublayers", "layout_sequence", "next_layout", "with_virtual"]  # for the face


def max_frozen_units(unit_ends: Sequence[int], num_sublayers: int, min_active: int) -> int:
    """The most units that may freeze while at least ``min_active`` sub-layers stay active.

    Without compression the pipeline keeps its length, so it needs one active sub-layer per stage.
    """
    best = 0
    for units, end in enumerate(unit_ends, start=1):
        if num_sublayers - end >= min_active:
            best = units
    return best


def next_layout(
    current: Layout,
    frozen: int,
    costs: Sequence[float],
    *,
    compression: CompressionRule,
    solver: Solver,
    budget: float,
    world_size: int,
    microbatches_for: Callable[[int], int] | None = None,
    memory: MemoryBudget | None = None,
    virtual: int | AutoVirtual | None = None,
) -> Layout:
    """The layout once the first ``frozen`` sub-layers are frozen.

    Args:
        current: the layout now.
        frozen: frozen sub-layers after the decision (``>= current.frozen``).
        costs: per-sub-layer cost (the same metric as ``budget``).
        compression: the rule choosing the new length.
        solver: partition solver name or function.
        budget: the largest per-stage cost allowed after compression (the bottleneck at the start).
        world_size: number of ranks (the new pipeline length must divide it).
        microbatches_for: micro-batch count for a pipeline length (default: keep the current count).
        memory: a per-rank memory budget: a layout that does not fit it is never chosen. When the rule's does
            not, the shortest longer divisor of the current length that fits is taken; when none does, the
            current layout stays (the freeze waits for a later decision point).
        virtual: the new layout's stages per rank: fixed, or :class:`~.virtual_choice.AutoVirtual` (chosen for
            the compression rule's length and the active sub-layers, and kept by the memory budget's longer
            lengths); ``None`` keeps ``current``'s.

    Raises:
        OrchestratorError: if the compressed length does not divide the world size.
    """
    if frozen == current.frozen:
        return current
    p = compression(list(costs[frozen:]), current.pipe_len, budget, world_size=world_size, solver=solver)
    pipe_len = p.num_stages
    if world_size % pipe_len:
        raise OrchestratorError(
            f"compression {compression.name!r} chose pipe_len={pipe_len}, which does not divide the world size "
            f"{world_size}"
        )
    active = list(costs[frozen:])
    microbatches = current.microbatches if microbatches_for is None else microbatches_for(pipe_len)
    v = stages_per_rank(current.virtual if virtual is None else virtual, active, pipe_len, microbatches, solver)
    if v > 1:  # the ranks chosen, the active sub-layers are cut into v stages per rank
        pipe_len = max(k for k in range(1, pipe_len + 1) if world_size % k == 0 and k * v <= len(active))
        p = part.solve(active, pipe_len * v, solver)
    layout = _layout(frozen, p, world_size, current, microbatches_for, virtual=v)
    if memory is None or memory.fits(layout):
        return layout
    longer = [
        k
        for k in range(pipe_len + 1, min(current.pipe_len, len(active) // v) + 1)
        if current.pipe_len % k == 0 and world_size % k == 0
    ]
    for k in longer:
        stages = part.solve(active, k * v, solver)
        candidate = _layout(frozen, stages, world_size, current, microbatches_for, virtual=v)
        if memory.fits(candidate):
            return candidate
    return current  # no layout of this many frozen sub-layers fits: the freeze waits for the next decision


def _layout(
    frozen: int,
    p: part.Partition,
    world_size: int,
    current: Layout,
    microbatches_for: Callable[[int], int] | None,
    *,
    virtual: int,
) -> Layout:
    """The layout of partition ``p``'s stages, ``virtual`` of them per rank."""
    pipe_len = p.num_stages // virtual
    boundaries = tuple(frozen + b for b in p.boundaries)
    microbatches = current.microbatches if microbatches_for is None else microbatches_for(pipe_len)
    return Layout(frozen, pipe_len, world_size // pipe_len, boundaries, microbatches, virtual)


def with_virtual(
    layout: Layout,
    virtual: int | AutoVirtual,
    costs: Sequence[float],
    *,
    solver: Solver,
    world_size: int,
    microbatches_for: Callable[[int], int],
) -> Layout:
    """``layout`` with ``virtual`` stages per rank: the same frozen prefix and number of ranks, the active
    sub-layers partitioned over ``pipe_len * virtual`` stages (a resume whose ``[pipeline] virtual`` differs from
    the checkpoint's). When fewer active sub-layers remain than stages, the number of ranks drops to the largest
    divisor of the world size that leaves every stage one, as at a transition (:func:`next_layout`). Under
    ``"auto"`` (:class:`~.virtual_choice.AutoVirtual`) v is chosen for the saved length and micro-batches: a run
    that chose it keeps its layout.

    Raises:
        OrchestratorError: fewer active sub-layers than ``virtual`` (not even one rank can hold them).
    """
    active = list(costs[layout.frozen :])
    virtual = stages_per_rank(virtual, active, layout.pipe_len, layout.microbatches, solver)
    if virtual == layout.virtual:
        return layout
    fits = [k for k in range(1, layout.pipe_len + 1) if world_size % k == 0 and k * virtual <= len(active)]
    if not fits:
        raise OrchestratorError(
            f"{len(active)} active sub-layer(s) cannot fill {virtual} stage(s) per rank: "
            "use a smaller [pipeline] virtual"
        )
    pipe_len = max(fits)
    p = part.solve(active, pipe_len * virtual, solver)
    boundaries = tuple(layout.frozen + b for b in p.boundaries)
    microbatches = layout.microbatches if pipe_len == layout.pipe_len else microbatches_for(pipe_len)
    return Layout(layout.frozen, pipe_len, world_size // pipe_len, boundaries, microbatches, virtual)


def frozen_sublayers(unit_ends: Sequence[int], units: int) -> int:
    """Sub-layers covered by the first ``units`` freezable units."""
    return 0 if units == 0 else unit_ends[units - 1]


def decide_units(
    policy: freeze.FreezePolicy,
    *,
    epoch: int,
    step: int,
    current: int,
    unit_ends: Sequence[int],
    num_sublayers: int,
    pipe_len: int,
    compression: CompressionRule,
    virtual: int | AutoVirtual = 1,
) -> int:
    """The frozen unit count after a decision point: the policy's proposal (checked by
    :func:`elastic_pipe.freeze.decide`), capped so that the pipeline keeps an active sub-layer per stage
    (``pipe_len * virtual`` stages when the rule keeps its length, ``virtual`` on one rank otherwise; under
    ``"auto"`` the fewest stages per rank the schedule runs), and never below ``current``."""
    v = virtual.fewest if isinstance(virtual, AutoVirtual) else virtual
    cap = max_frozen_units(unit_ends, num_sublayers, (pipe_len if compression.keeps_length else 1) * v)
    return max(min(freeze.decide(policy, epoch, step, current), cap), current)


def layout_sequence(
    costs: Sequence[float],
    unit_ends: Sequence[int],
    policy: freeze.FreezePolicy,
    *,
    epochs: int,
    steps_per_epoch: int,
    pipe_len: int,
    world_size: int,
    compression: CompressionRule,
    solver: Solver,
    microbatches_for: Callable[[int], int],
    pipe_lens: Sequence[int] | None = None,
    memory: MemoryBudget | None = None,
    virtual: int | AutoVirtual = 1,
) -> list[tuple[int, Layout]]:
    """``(frozen units, layout)`` per epoch, decided exactly as a run decides them (a decision point before every
    epoch but the first), for a policy that reads no measured statistics (``needs_stats`` False).

    Args:
        costs: per-sub-layer cost.
        unit_ends: where each freezable unit ends (sub-layer index, exclusive).
        policy: the freeze policy (it is asked, so its state advances as in a run).
        epochs: epochs of the run.
        steps_per_epoch: optimizer steps per epoch.
        pipe_len: initial pipeline length.
        world_size: number of ranks.
        compression: the rule.
        solver: partition solver.
        microbatches_for: micro-batches for a pipeline length.
        pipe_lens: the reachable lengths, ``pipe_len`` first (default: ``pipe_len`` alone); read with ``memory``.
        memory: the per-rank budget, as a run applies it (start and compression).
        virtual: stages per rank: fixed, or :class:`~.virtual_choice.AutoVirtual` (chosen per layout).
    """
    layout, budget = start_layout(
        costs,
        pipe_lens or (pipe_len,),
        world_size,
        solver=solver,
        microbatches_for=microbatches_for,
        memory=memory,
        virtual=virtual,
    )
    units = 0
    out = [(units, layout)]
    for epoch in range(1, epochs):
        units = decide_units(
            policy,
            epoch=epoch,
            step=epoch * steps_per_epoch,
            current=units,
            unit_ends=unit_ends,
            num_sublayers=len(costs),
            pipe_len=layout.pipe_len,
            compression=compression,
            virtual=virtual,
        )
        layout = next_layout(
            layout,
            frozen_sublayers(unit_ends, units),
            costs,
            compression=compression,
            solver=solver,
            budget=budget,
            world_size=world_size,
            microbatches_for=microbatches_for,
            memory=memory,
            virtual=virtual,
        )
        out.append((units, layout))
    return out
