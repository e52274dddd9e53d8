"""An epoch's record: the evaluation when one is due and the :class:`~.report.records.EpochMetrics` built from what the
step loop (:class:`~.step_loop.EpochRun`) measured."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from elastic_pipe.orchestrator.evaluation import evaluate
from elastic_pipe.orchestrator.report import EpochMetrics
from elastic_pipe.orchestrator.stage import StageRuntime, step_record

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix
    from elastic_pipe.orchestrator.state import RunState

__all__ = ["epoch_metrics", "finish_epoch"]


def epoch_metrics(
    state: RunState,
    stage: StageRuntime,
    prefix: FrozenPrefix,
    *,
    steps: int,
    samples: int,
    samples_run: int,
    dropped: int,
    losses: list[float],
    phases: dict[str, float],
    seconds: float,
    scores: tuple[float | None, float | None],
    lr: float,
) -> EpochMetrics:
    """The record of an epoch from what :class:`~.step_loop.EpochRun` measured and the evaluation's scores."""
    layout = stage.layout
    ops = int(phases["grad_sync_ops"])
    return EpochMetrics(
        epoch=state.epoch,
        steps=steps,
        samples=samples,
        dropped=dropped,
        seconds=seconds,
        samples_per_s=samples_run / seconds if seconds > 0 else 0.0,
        loss=float(sum(losses) / steps),
        eval_loss=scores[0],
        eval_accuracy=scores[1],
        data_s=phases["data"],
        forward_s=phases["forward"],
        backward_s=phases["backward"],
        grad_sync_s=phases["grad_sync"],
        optimizer_s=phases["optimizer"],
        grad_sync_ops=ops,
        grad_sync_ops_per_s=ops / seconds if seconds > 0 else 0.0,
        first_step_s=phases["first_step"],
        pipe_len=layout.pipe_len,
        replicas=layout.replicas,
        frozen_units=state.frozen_units,
        frozen_sublayers=layout.frozen,
        microbatches=layout.microbatches,
        cache=prefix.cache_on,
        lr=lr,
        **step_record(stage.runner, stage.graph_choices.get(stage.rows)),
        cache_hits=int(phases.get("cache_hits", 0)),
        cache_misses=int(phases.get("cache_misses", 0)),
        cache_corrupt=int(phases.get("cache_corrupt", 0)),
        cache_view=prefix.cache_view(state.epoch),
    )


def finish_epoch(
    ctx: RunContext,
    state: RunState,
    stage: StageRuntime,
    prefix: FrozenPrefix,
    *,
    done: int,
    first: int,
    losses: list[float],
    phases: dict[str, float],
    seconds: float,
    lr: float,
) -> tuple[EpochMetrics, tuple[float | None, float | None]]:
    """Evaluate when due (every ``[log] eval_every`` epochs, the run's last one and a ``max_steps`` stop; a
    collective) and build the epoch's record from what :class:`~.step_loop.EpochRun` measured.

    Args:
        done: steps of the epoch done so far; ``first``: those done before this attempt (a mid-epoch resume).
    """
    c, plan = ctx.config, ctx.epoch
    stopped = bool(c.train.max_steps) and state.step >= c.train.max_steps
    last = stopped or state.epoch + 1 >= c.train.epochs
    scores: tuple[float | None, float | None] = (None, None)
    eval_s = 0.0
    if last or (state.epoch + 1) % c.log.eval_every == 0:
        t0 = time.perf_counter()
        scores = evaluate(ctx, state.layout, prefix)  # its results are read on the host: the device is done
        eval_s = time.perf_counter() - t0
    metrics = epoch_metrics(
        state,
        stage,
        prefix,
        steps=done,
        samples=sum(plan.size(j) for j in range(done)),
        samples_run=sum(plan.size(j) for j in range(first, max(done, first + 1))),
        dropped=plan.dropped if done >= plan.steps else 0,
        losses=losses,
        phases=phases,
        seconds=seconds,
        scores=scores,
        lr=lr,
    )
    return dataclasses.replace(metrics, eval_s=eval_s), scores
