"""The first layout of a run and the per-rank memory budget every layout must fit (``[pipeline] memory_budget``):
the initial pipeline length is the configured one (:func:`initial_layout`), or with a budget the shortest that fits
it (:func:`initial_layout_within`); :func:`start_layout` picks between them. The layouts after it come from the
layout rule (:mod:`.rule`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastic_pipe import partition as part
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.layout.virtual_choice import stages_per_rank
from elastic_pipe.types import Layout

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.layout.compression import Solver
    from elastic_pipe.orchestrator.layout.virtual_choice import AutoVirtual

__all__ = ["MemoryBudget", "initial_layout", "initial_layout_within", "start_layout"]


@dataclass(frozen=True)
class MemoryBudget:
    """The most bytes one rank may hold, and what each sub-layer costs where it is held.

    Attributes:
        limit: bytes per rank.
        active: bytes of each sub-layer while it trains: weights, gradients and optimizer state.
        frozen: bytes of each sub-layer once frozen (only stage 0 holds it): its weights.
    """

    limit: int
    active: tuple[int, ...]
    frozen: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.limit < 1 or len(self.active) != len(self.frozen):
            raise ConfigError(f"a memory budget needs a positive limit and one size per sub-layer, got {self!r}")

    @classmethod
    def for_parameters(cls, limit: int, param_bytes: Sequence[int], optimizer_slots: int) -> MemoryBudget:
        """A budget for sub-layers of ``param_bytes`` with ``optimizer_slots`` parameter-sized optimizer tensors
        each (AdamW 2, SGD with momentum 1)."""
        return cls(limit, tuple(b * (2 + optimizer_slots) for b in param_bytes), tuple(param_bytes))

    def stage_bytes(self, layout: Layout) -> list[int]:
        """Bytes the ranks of each pipeline position hold under ``layout`` (all their stages; position 0 with the
        frozen prefix)."""
        b = layout.boundaries
        if layout.virtual == 1:
            out = [sum(self.active[b[s] : b[s + 1]]) for s in range(layout.pipe_len)]
        else:
            placement = layout.placement()
            out = [sum(sum(self.active[lo:hi]) for lo, hi in placement.ranges_of(p)) for p in range(layout.pipe_len)]
        out[0] += sum(self.frozen[: layout.frozen])
        return out

    def fits(self, layout: Layout) -> bool:
        """Whether every rank of ``layout`` stays within the limit."""
        return max(self.stage_bytes(layout)) <= self.limit


def initial_layout(
    costs: Sequence[float],
    pipe_len: int,
    world_size: int,
    *,
    solver: Solver,
    microbatches: int,
    virtual: int | AutoVirtual = 1,
) -> tuple[Layout, float]:
    """The layout at the start (nothing frozen) and its bottleneck cost, the budget compression must respect.

    With ``virtual`` stages per rank (fixed, or chosen for this length by
    :func:`~.virtual_choice.choose_virtual` under ``"auto"``) the sub-layers are partitioned over
    ``pipe_len * virtual`` stages; the budget stays the bottleneck of ``pipe_len`` blocks, the granularity the
    compression rule compares.
    """
    p = part.solve(list(costs), pipe_len, solver)
    virtual = stages_per_rank(virtual, costs, pipe_len, microbatches, solver)
    if virtual == 1:
        layout = Layout(0, pipe_len, world_size // pipe_len, tuple(p.boundaries), microbatches)
    else:
        stages = part.solve(list(costs), pipe_len * virtual, solver)
        layout = Layout(0, pipe_len, world_size // pipe_len, tuple(stages.boundaries), microbatches, virtual)
    return layout, float(p.bottleneck)


def initial_layout_within(
    costs: Sequence[float],
    pipe_lens: Sequence[int],
    world_size: int,
    memory: MemoryBudget,
    *,
    solver: Solver,
    microbatches_for: Callable[[int], int],
    virtual: int | AutoVirtual = 1,
) -> tuple[Layout, float]:
    """The start layout of the shortest pipeline among ``pipe_lens`` whose every rank fits ``memory`` (``virtual``
    stages per rank).

    Raises:
        ConfigError: no length fits; the message gives the bytes the best one needs per rank and the limit.
    """
    best: tuple[int, int] | None = None
    for k in sorted(pipe_lens):
        layout, bottleneck = initial_layout(
            costs, k, world_size, solver=solver, microbatches=microbatches_for(k), virtual=virtual
        )
        need = max(memory.stage_bytes(layout))
        if need <= memory.limit:
            return layout, bottleneck
        best = (k, need) if best is None or need < best[1] else best
    assert best is not None  # pipe_lens is never empty
    raise ConfigError(
        f"[pipeline] memory_budget = {memory.limit:,} bytes per rank: no pipeline length fits on {world_size} "
        f"process(es) (the best, {best[0]} stage(s), needs {best[1]:,} bytes on one rank; the whole training state "
        f"is {sum(memory.active):,} bytes); use more processes, a longer pipe_len or a larger budget"
    )


def start_layout(
    costs: Sequence[float],
    pipe_lens: Sequence[int],
    world_size: int,
    *,
    solver: Solver,
    microbatches_for: Callable[[int], int],
    memory: MemoryBudget | None = None,
    virtual: int | AutoVirtual = 1,
) -> tuple[Layout, float]:
    """A run's first layout and the bottleneck compression keeps: over the initial length ``pipe_lens[0]``, or
    with a memory budget over the shortest of ``pipe_lens`` that fits it (:func:`initial_layout_within`), with
    ``virtual`` stages per rank (fixed, or ``"auto"``: chosen for the length taken).

    Raises:
        ConfigError: a budget no length fits.
    """
    if memory is not None:
        return initial_layout_within(
            costs, pipe_lens, world_size, memory, solver=solver, microbatches_for=microbatches_for, virtual=virtual
        )
    k = pipe_lens[0]
    return initial_layout(costs, k, world_size, solver=solver, microbatches=microbatches_for(k), virtual=virtual)
