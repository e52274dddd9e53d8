"""Process-group planning and management: pure rank layouts (SPMD and the published PipeTransformer layout),
and a manager that creates the control group and every training group once, with real timeouts.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.

Example::

    plan = plan_spmd(world_size=8, pipe_len=4)
    assert plan.pipeline_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert plan_pipetransformer(16, 8, 4).new_ranks == (1, 9)
"""

from __future__ import annotations

from elastic_pipe.groups.errors import BarrierTimeoutError, GroupsError, GroupsTypeError
from elastic_pipe.groups.manager import CONTROL_BACKEND, MAX_BROADCAST_BYTES, GroupManager, silent_ranks
from elastic_pipe.groups.pipetransformer import PipeTransformerPlan, active_ranks, plan_pipetransformer
from elastic_pipe.groups.spmd import RankPlan, plan_spmd

__all__ = [
    "CONTROL_BACKEND",
    "MAX_BROADCAST_BYTES",
    "BarrierTimeoutError",
    "GroupManager",
    "GroupsError",
    "GroupsTypeError",
    "PipeTransformerPlan",
    "RankPlan",
    "active_ranks",
    "plan_pipetransformer",
    "plan_spmd",
    "silent_ranks",
]
