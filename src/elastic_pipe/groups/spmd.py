"""The SPMD rank layout: one process per device, ``W / K`` pipeline replicas of ``K`` stages each.

Rule: rank ``r`` is stage ``r % K`` of replica ``r // K``. Pipeline replicas are blocks of consecutive ranks,
and launchers number the ranks of a node consecutively, so a pipeline stays inside one node whenever ``K``
divides the devices per node. That is the placement we want: a pipeline sends activations and gradients
between neighbouring stages for every micro-batch, while data-parallel peers (the same stage across replicas)
exchange gradients once per step, so the data-parallel groups are the ones that should cross nodes. When
``gpus_per_node`` is given, :func:`plan_spmd` checks it: ``K`` must divide it (pipelines inside a node) or be a
multiple of it (a pipeline longer than a node spans whole nodes, never parts of two).

Example, W=8, K=4::

    rank     0 1 2 3 | 4 5 6 7
    replica  0 0 0 0 | 1 1 1 1
    stage    0 1 2 3 | 0 1 2 3
    pipeline groups: (0, 1, 2, 3), (4, 5, 6, 7)
    data-parallel groups: (0, 4), (1, 5), (2, 6), (3, 7)
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_pipe.groups.errors import CHECK, GroupsError

__all__ = ["MAX_WORLD_SIZE", "RankPlan", "check_count", "plan_spmd"]


#: The most processes a layout takes: beyond any cluster, and it bounds the rank lists a plan builds.
MAX_WORLD_SIZE = 65_536


def check_count(name: str, value: object) -> int:
    """``value`` if it is an int in ``[1, MAX_WORLD_SIZE]`` (a world size, a pipeline length, devices per node)."""
    return CHECK.int(name, value, lo=1, hi=MAX_WORLD_SIZE)


@dataclass(frozen=True, slots=True)
class RankPlan:
    """Who is who for one pipeline length in the SPMD layout (see the module docstring for the rule).

    Build it with :func:`plan_spmd`, which validates the combination.

    Attributes:
        world_size: number of processes (one per device).
        pipe_len: pipeline length K (stages per replica).
        gpus_per_node: devices per node, or None for "one node" (no placement check).
    """

    world_size: int
    pipe_len: int
    gpus_per_node: int | None = None

    def __post_init__(self) -> None:
        w = check_count("world_size", self.world_size)
        k = check_count("pipe_len", self.pipe_len)
        if w % k:
            raise GroupsError(f"pipe_len {k} must divide world_size {w} (every replica needs a full pipeline)")
        if self.gpus_per_node is not None:
            g = check_count("gpus_per_node", self.gpus_per_node)
            if w % g:
                raise GroupsError(f"gpus_per_node {g} must divide world_size {w} (whole nodes only)")
            if g % k and k % g:
                raise GroupsError(
                    f"pipe_len {k} must divide gpus_per_node {g} (pipelines inside a node) or be a multiple of "
                    "it (pipelines over whole nodes); otherwise a pipeline would straddle two nodes"
                )

    @property
    def replicas(self) -> int:
        """Number of data-parallel pipeline replicas, ``world_size // pipe_len``."""
        return self.world_size // self.pipe_len

    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise GroupsError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")

    def stage_of(self, rank: int) -> int:
        """The pipeline stage that ``rank`` runs."""
        self._check_rank(rank)
        return rank % self.pipe_len

    def replica_of(self, rank: int) -> int:
        """The pipeline replica that ``rank`` belongs to."""
        self._check_rank(rank)
        return rank // self.pipe_len

    def node_of(self, rank: int) -> int | None:
        """The node that ``rank`` runs on, or None when ``gpus_per_node`` is not given."""
        self._check_rank(rank)
        return None if self.gpus_per_node is None else rank // self.gpus_per_node

    def rank_of(self, replica: int, stage: int) -> int:
        """The rank that runs ``stage`` of ``replica``."""
        if not 0 <= replica < self.replicas or not 0 <= stage < self.pipe_len:
            raise GroupsError(
                f"need replica in [0, {self.replicas}) and stage in [0, {self.pipe_len}), got {replica}, {stage}"
            )
        return replica * self.pipe_len + stage

    @property
    def pipeline_groups(self) -> tuple[tuple[int, ...], ...]:
        """One group per replica, its ranks in stage order."""
        k = self.pipe_len
        return tuple(tuple(range(d * k, (d + 1) * k)) for d in range(self.replicas))

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]:
        """One group per stage: that stage's rank in every replica, in replica order."""
        return tuple(tuple(range(s, self.world_size, self.pipe_len)) for s in range(self.pipe_len))

    def pipeline_group_of(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s pipeline, in stage order."""
        return self.pipeline_groups[self.replica_of(rank)]

    def dp_group_of(self, rank: int) -> tuple[int, ...]:
        """The ranks that hold the same stage as ``rank``, in replica order."""
        return self.dp_groups[self.stage_of(rank)]


def plan_spmd(world_size: int, pipe_len: int, gpus_per_node: int | None = None) -> RankPlan:
    """Plan the SPMD layout for ``world_size`` devices and pipeline length ``pipe_len``.

    Args:
        world_size: number of processes, one per device.
        pipe_len: pipeline length K; must divide ``world_size``.
        gpus_per_node: devices per node, if the job spans nodes; K must divide it or be a multiple of it.

    Returns:
        The validated plan.

    Raises:
        GroupsError: the combination cannot be laid out.
    """
    return RankPlan(world_size=world_size, pipe_len=pipe_len, gpus_per_node=gpus_per_node)
