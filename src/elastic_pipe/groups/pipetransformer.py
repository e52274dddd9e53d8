"""The published PipeTransformer layout: one process per pipeline (REFERENCE.md section 4).

All ``W`` processes start at launch, one per device, but only some of them drive a pipeline. With initial
pipeline length ``K0`` and current length ``K``, the active ranks are ``d * K0 + i`` for every replica slot
``d`` in ``0 .. W/K0 - 1`` and ``i`` in ``0 .. K0/K - 1``: each block of ``K0`` devices starts with one
pipeline, and every halving of ``K`` wakes up as many more processes in that block. The ranks newly activated by
going from ``2K`` to ``K`` are the active ranks at ``K`` that were not active at ``2K``.

Example, W=16, K0=8: K=8 -> active [0, 8]; K=4 -> active [0, 1, 8, 9], new [1, 9];
K=2 -> active [0, 1, 2, 3, 8, 9, 10, 11], new [2, 3, 10, 11].
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_pipe.groups.errors import GroupsError
from elastic_pipe.groups.spmd import check_count

__all__ = ["PipeTransformerPlan", "active_ranks", "plan_pipetransformer"]


def active_ranks(world_size: int, initial_pipe_len: int, pipe_len: int) -> tuple[int, ...]:
    """The ranks that drive a pipeline at length ``pipe_len``, in increasing order (the counts are checked for type
    and range; their divisibility is :class:`PipeTransformerPlan`'s to check)."""
    for name, value in (("world_size", world_size), ("initial_pipe_len", initial_pipe_len), ("pipe_len", pipe_len)):
        check_count(name, value)
    return tuple(
        d * initial_pipe_len + i
        for d in range(world_size // initial_pipe_len)
        for i in range(initial_pipe_len // pipe_len)
    )


@dataclass(frozen=True, slots=True)
class PipeTransformerPlan:
    """Active and newly activated ranks of the published layout (see the module docstring for the rule).

    Attributes:
        world_size: number of processes started at launch (one per device).
        initial_pipe_len: K0, the pipeline length at the start; must divide ``world_size``.
        pipe_len: K, the current pipeline length; must divide ``initial_pipe_len``.
    """

    world_size: int
    initial_pipe_len: int
    pipe_len: int

    def __post_init__(self) -> None:
        for name in ("world_size", "initial_pipe_len", "pipe_len"):
            check_count(name, getattr(self, name))
        if self.world_size % self.initial_pipe_len:
            raise GroupsError(f"initial_pipe_len {self.initial_pipe_len} must divide world_size {self.world_size}")
        if self.initial_pipe_len % self.pipe_len:
            raise GroupsError(
                f"pipe_len {self.pipe_len} must divide initial_pipe_len {self.initial_pipe_len} "
                "(the published system only shortens pipelines by halving)"
            )
        ratio = self.initial_pipe_len // self.pipe_len
        if ratio & (ratio - 1):  # K0 / K must be a power of two: pipelines shrink by halving
            raise GroupsError(
                f"pipe_len {self.pipe_len} cannot be reached by halving initial_pipe_len {self.initial_pipe_len}"
            )

    @property
    def active_ranks(self) -> tuple[int, ...]:
        """Ranks that drive a pipeline at ``pipe_len``, in increasing order."""
        return active_ranks(self.world_size, self.initial_pipe_len, self.pipe_len)

    @property
    def new_ranks(self) -> tuple[int, ...]:
        """Ranks activated by going from ``2 * pipe_len`` to ``pipe_len`` (empty at the initial length)."""
        if self.pipe_len == self.initial_pipe_len:
            return ()
        before = set(active_ranks(self.world_size, self.initial_pipe_len, 2 * self.pipe_len))
        return tuple(r for r in self.active_ranks if r not in before)

    @property
    def replicas(self) -> int:
        """Number of pipeline replicas running at ``pipe_len`` (one per active rank)."""
        return (self.world_size // self.initial_pipe_len) * (self.initial_pipe_len // self.pipe_len)

    @property
    def devices_per_pipeline(self) -> int:
        """Devices each active process drives: the pipeline length."""
        return self.pipe_len


def plan_pipetransformer(world_size: int, initial_pipe_len: int, pipe_len: int) -> PipeTransformerPlan:
    """Plan the published one-process-per-pipeline layout.

    Args:
        world_size: processes started at launch, one per device.
        initial_pipe_len: K0; must divide ``world_size``.
        pipe_len: K; must be K0 halved zero or more times.

    Returns:
        The validated plan with ``active_ranks`` and ``new_ranks``.

    Raises:
        GroupsError: the combination does not fit the published layout.
    """
    return PipeTransformerPlan(world_size=world_size, initial_pipe_len=initial_pipe_len, pipe_len=pipe_len)
