"""Run a :class:`Schedule` on torch.distributed.pipelining (gloo on CPU, NCCL on GPU).

torch executes a custom per-rank action list through its schedule runtime: the compute-only lists (one per rank,
in the same "2F0" text form as ours) are lowered by torch itself into lists with the matching SEND/RECV actions,
then ``step()`` runs this rank's list. That runtime class (``_PipelineScheduleRuntime``) and its lowering
method are private in torch, so this module is the only place that touches them; everything else in the package
is torch-free. The private surface used (checked on torch 2.11 and 2.13; torch's own interleaved and zero-bubble
schedules are built on it):

* ``torch.distributed.pipelining.schedules._PipelineScheduleRuntime(stages, n_microbatches, loss_fn=...,
  scale_grads=...)``, the base class of torch's own interleaved and zero-bubble schedules;
* ``_Action.from_str(text)`` to build torch's action objects from our text form;
* ``_prepare_schedule_with_comms(actions)`` (named ``_load_actions`` in older releases) to lower and load them.

The gloo test in tests/test_schedule_exec.py checks, for every generator, that a pipelined step gives the same
gradients as the unpipelined model; it is the guard for a torch upgrade (examples/schedule_torchrun.py --check
does the same over NCCL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from elastic_pipe.schedule.errors import CHECK, ScheduleError
from elastic_pipe.schedule.ir import Schedule

if TYPE_CHECKING:  # torch is imported only when a schedule is lowered, so the rest of the package stays light
    import torch

__all__ = ["torch_actions", "torch_schedule"]


def torch_actions(schedule: Schedule) -> dict[int, list[Any]]:
    """The schedule as torch's compute-only ``pipeline_order``: rank -> list of torch ``_Action`` objects."""
    CHECK.instance("schedule", schedule, Schedule)
    from torch.distributed.pipelining.schedules import _Action  # noqa: PLC0415 (keeps import of the package light)

    return {rank: [_Action.from_str(str(a)) for a in acts] for rank, acts in schedule.actions.items()}


def torch_schedule(
    schedule: Schedule,
    rank: int,
    stages: list[Any],
    loss_fn: Callable[..., torch.Tensor],
    *,
    scale_grads: bool = True,
) -> Any:
    """Build the torch schedule object that runs ``rank``'s actions of ``schedule``.

    Args:
        schedule: a valid schedule (see :func:`elastic_pipe.schedule.validate`).
        rank: this process's rank in the pipeline group.
        stages: the ``torch.distributed.pipelining.PipelineStage`` objects this rank holds, exactly the stages
            ``schedule.stages_of(rank)`` (any order).
        loss_fn: ``loss_fn(output, target)`` applied to each micro-batch's output on the last stage.
        scale_grads: divide gradients by the number of micro-batches (right for a mean-reduced ``loss_fn``:
            the step then yields the gradient of the whole batch's mean loss).

    Returns:
        A torch schedule whose ``.step(*inputs, target=..., losses=...)`` splits the batch into
        ``schedule.microbatches`` micro-batches and runs this rank's actions (inputs on the first stage's rank,
        target on the last stage's rank).

    Raises:
        ScheduleError: the stages do not match the schedule's placement, stage count or group size.
    """
    CHECK.instance("schedule", schedule, Schedule)
    CHECK.int("rank", rank, hi=schedule.num_ranks - 1)
    stages = CHECK.items("stages", stages, empty=True)
    CHECK.callable("loss_fn", loss_fn)
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime  # noqa: PLC0415 (see _Action)

    if not stages:
        raise ScheduleError(f"rank {rank} passed no stages; the schedule places {schedule.stages_of(rank)} on it")
    held = sorted(int(s.stage_index) for s in stages)
    expected = list(schedule.stages_of(rank))
    if held != expected:
        raise ScheduleError(f"rank {rank} holds stages {held} but the schedule places stages {expected} on it")
    for stage in stages:
        if stage.num_stages != schedule.num_stages or stage.group_size != schedule.num_ranks:
            raise ScheduleError(
                f"stage {stage.stage_index} was built for {stage.num_stages} stages on {stage.group_size} ranks; "
                f"the schedule has {schedule.num_stages} stages on {schedule.num_ranks} ranks"
            )
    runtime: Any = _PipelineScheduleRuntime(  # type: ignore[no-untyped-call]
        stages, n_microbatches=schedule.microbatches, loss_fn=loss_fn, scale_grads=scale_grads
    )
    order = torch_actions(schedule)
    runtime.pipeline_order = order
    lower = getattr(runtime, "_prepare_schedule_with_comms", None) or runtime._load_actions
    lower({r: list(acts) for r, acts in order.items()})
    return runtime
