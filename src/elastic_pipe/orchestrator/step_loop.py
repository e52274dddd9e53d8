"""One epoch of pipelined steps in one layout: :class:`EpochRun` runs them until the trainer has work to do.

Semantics. The global batch is fixed: each replica takes ``global_batch / R`` samples per step from the elastic
sampler and the gradient is the mean over the global batch whatever ``R`` is, so the loss curve does not depend on
the layout (the equivalence test checks this in float64). The learning-rate schedule counts optimizer steps and
is unaffected too.

Who holds what. The trainer holds the run's position (:class:`~.state.RunState`) and alone advances it; an
:class:`EpochRun` holds one epoch's machinery (the batch iterator, the phase clock, the progress bar, the epoch's
seconds) and runs steps until the epoch's end, ``[train] max_steps``, a decision point or a step checkpoint, and
says which in a :class:`Steps`. The trainer then decides or saves and asks it to go on from the next step.

Decision points inside an epoch (``[freeze] decide_every = N``): after every step that brings the run's step count
to a multiple of ``N`` (but an epoch's last, which the trainer decides after the epoch's evaluation). A decision
that keeps the layout goes on with the same batches; one that changes it :meth:`~EpochRun.pause`\\ s the epoch
(the losses so far reduced in the old layout), applies the transition and :meth:`~EpochRun.go_on`\\ s: the batches
read anew from the sampler's position (re-sharded), the transition's time left out of the epoch's seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe.orchestrator.data import Batch, ElasticBatchSampler
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.launch import maybe_fail
from elastic_pipe.orchestrator.report import PHASES, EpochLosses, PhaseClock, Progress, check_finite_losses, step_loss
from elastic_pipe.orchestrator.step_ops import clip_global_grad_norm, decision_point, reseed, step_seed

if TYPE_CHECKING:
    from elastic_pipe import data as edata
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix
    from elastic_pipe.orchestrator.stage import StageRuntime

__all__ = ["EpochRun", "Steps"]


def _zero_grad(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """``optimizer.zero_grad(set_to_none=True)``, as a direct loop over its parameters when the optimizer keeps
    torch's own ``zero_grad`` (which adds a profiler record and hook lookups per step); a layout's parameters do
    not change inside it, so the list is taken once."""
    if type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad:
        return lambda: optimizer.zero_grad(set_to_none=True)
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def zero() -> None:
        for p in params:
            p.grad = None

    return zero


def _timed_step(done: int, steps: int, interval: int) -> bool:
    """Whether step ``done`` (0-based) of an epoch's ``steps`` is split into phases: every ``interval``-th step,
    never the first (it carries the warm-up of a new layout), and the last when the epoch is shorter than that."""
    return done % interval == interval - 1 or (done == steps - 1 and steps < interval)


#: What an exhausted batch iterator gives: no indices (the loop then reports the sampler ran dry).
_NO_BATCH = Batch(torch.zeros(0, dtype=torch.long), None, None)


def _close(batches: Iterator[Batch]) -> None:
    """Let a data loader's workers go (a batch iterator left before its end)."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Steps:
    """What one call of :meth:`EpochRun.steps` did.

    Attributes:
        count: optimizer steps it ran (the trainer adds them to the run's position).
        done: steps of the epoch done after them.
        decision: a decision point (``[freeze] decide_every``) follows its last step, inside the epoch.
        checkpoint: a step checkpoint (``[checkpoint] steps``) is due after its last step, inside the epoch, the
            run not stopped at ``max_steps``.

    Neither flag set: the epoch ended, or the run reached ``[train] max_steps``.
    """

    count: int
    done: int
    decision: bool
    checkpoint: bool


class EpochRun:
    """The rest of one epoch (a mid-epoch resume starts at the sampler's position), starting in ``stage``'s layout.

    Construction starts the epoch (the sampler's epoch, the prefix's counters, the first batches read ahead);
    :meth:`steps` runs steps; :meth:`pause` and :meth:`go_on` frame a transition inside the epoch; :meth:`finish`
    ends it (a collective).

    Args:
        epoch: the epoch (0-based).
        losses: the trainer's record of the epoch's losses, to which each step's loss is added on the device.
        save_every: ``[checkpoint] steps`` when checkpoints are written (0: no step checkpoints).
    """

    def __init__(
        self,
        ctx: RunContext,
        stage: StageRuntime,
        prefix: FrozenPrefix,
        *,
        epoch: int,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        sampler: edata.ElasticSampler,
        losses: EpochLosses,
        save_every: int = 0,
    ) -> None:
        c, device = ctx.config, ctx.device
        self.ctx, self.stage, self.prefix, self.epoch = ctx, stage, prefix, epoch
        self.optimizer, self.scheduler, self.sampler, self.losses = optimizer, scheduler, sampler, losses
        self.save_every = save_every
        plan = ctx.epoch
        sampler.set_epoch(epoch)  # the same epoch again keeps the sampler's progress (mid-epoch resume)
        #: The epoch's first step in this attempt, and the next step to run.
        self.first = self.next = plan.steps_done(sampler.consumed)
        self.first_step_s = 0.0
        prefix.begin_epoch(epoch)
        self.batches = self._read_from(self.first, stage)
        self.clock = PhaseClock(device)
        self.sync_ops = 0
        self.paused = 0.0  # seconds spent in transitions inside the epoch
        self._t_pause = 0.0
        losses.local = []
        self.no_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.zero_grad = _zero_grad(optimizer)
        stage.forward_timer.collect()
        _sync(device)
        self.t_epoch = time.perf_counter()
        label = f"epoch {epoch + 1}/{c.train.epochs}"
        stream = ctx.log.stream
        self.progress = Progress(
            plan.steps, label, enabled=stream is not None and c.log.progress, start=self.first, stream=stream
        )

    def _read_from(self, step: int, stage: StageRuntime) -> Iterator[Batch]:
        """The rest of the epoch's batches, read from the sampler's position in ``stage``'s layout (a data
        loader's workers read ahead); only stage 0 needs inputs, only the last stage labels."""
        prefix, plan = self.prefix, self.ctx.epoch
        # with the cache on, each step's lookup starts a step ahead
        return prefix.batches(
            self.ctx.train_set.batches(
                ElasticBatchSampler(self.sampler, plan.sizes(step)),
                inputs=prefix.needs_inputs,
                labels=stage.is_last,
                device=self.ctx.device,
            )
        )

    def steps(self, step: int) -> Steps:
        """Run steps from the next one until the epoch's end, ``max_steps``, a decision point or a step checkpoint.

        Args:
            step: optimizer steps of the run before the next one (the trainer's :attr:`RunState.step`).
        """
        ctx, stage, prefix = self.ctx, self.stage, self.prefix
        c, device, plan, layout, epoch = ctx.config, ctx.device, ctx.epoch, stage.layout, self.epoch
        optimizer, scheduler, sampler, batches = self.optimizer, self.scheduler, self.sampler, self.batches
        clock, progress, timer, zero_grad = self.clock, self.progress, stage.forward_timer, self.zero_grad
        losses, no_loss, first, steps_per_epoch = self.losses.local, self.no_loss, self.first, plan.steps
        seed, rank, host_ids = c.train.seed, ctx.rank, ctx.host_ids
        max_steps, every, save_every = c.train.max_steps, c.freeze.every_steps, self.save_every
        start, sync_ops = step, 0
        done, decision, checkpoint = self.next, False, False
        for i in range(self.next, steps_per_epoch):
            if max_steps and step >= max_steps:
                break
            maybe_fail("step", rank, epoch, i)
            # Random ops in training (dropout) draw from generators reseeded at every step from (seed, epoch, step,
            # rank): a resume from any step checkpoint reproduces the masks, and ranks draw independently.
            # reseed sets the CPU generator and the rank's device's, as torch.manual_seed would (and nothing else).
            reseed(step_seed(seed, epoch, i, rank), device)
            timed = device.type != "cuda" or _timed_step(i - first, steps_per_epoch - first, c.log.timing_interval)
            timer.active = timed
            clock.start(timed=timed)
            size = plan.size(i)
            host_idx, x, y = next(batches, _NO_BATCH)
            if host_idx.numel() != size // layout.replicas:
                raise OrchestratorError(
                    f"the sampler ran dry at step {i} of epoch {epoch}: got {host_idx.numel()} of "
                    f"{size // layout.replicas} indices"
                )
            clock.lap("data")
            if stage.is_first:  # no inputs loaded when the cache holds them all (prefix.needs_inputs)
                x = prefix.forward(x, host_ids[host_idx])
            clock.lap("forward")
            step_losses: list[torch.Tensor] = []
            stage.run(x, y, step_losses, rows=size // layout.replicas // layout.microbatches)
            step_s = clock.lap("backward")
            if timed:
                fwd = min(timer.collect(), step_s)
                clock.totals["forward"] += fwd
                clock.totals["backward"] -= fwd
            sync_ops += stage.grad_sync()
            clock.lap("grad_sync")
            stage.tracker.accumulate()  # holds no layers when the policy does not read their statistics
            if c.train.max_grad_norm:  # after the statistics: a freeze policy judges the gradients as they are
                clip_global_grad_norm(stage, c.train.max_grad_norm, device)
            optimizer.step()
            scheduler.step()
            zero_grad()
            sampler.advance(size)
            step += 1
            clock.lap("optimizer")
            losses.append(step_loss(step_losses, no_loss))
            if i == first:  # the layout's warm-up (and, compiled, its compilation) lands in the first step
                _sync(device)
                self.first_step_s = time.perf_counter() - self.t_epoch
            done = i + 1
            progress.update(done)
            inside = done < steps_per_epoch
            stopped = bool(max_steps) and step >= max_steps
            decision = inside and decision_point(step, every)
            checkpoint = inside and not stopped and bool(save_every) and done % save_every == 0
            if decision or checkpoint or stopped:
                break
        self.next = done
        self.sync_ops += sync_ops
        return Steps(step - start, done, decision, checkpoint)

    def pause(self, step: int) -> None:
        """Before a transition inside the epoch (a collective; ``step``: the run's optimizer steps so far): leave
        the batches, reduce the losses so far while the old layout is current, and stop at a non-finite one
        (``[train] on_nonfinite``)."""
        ctx = self.ctx
        self._t_pause = time.perf_counter()
        _close(self.batches)
        self.losses.fold(self.stage, ctx.device)
        if ctx.config.train.on_nonfinite == "stop":  # the losses read back so far start at the epoch's first step
            done = self.losses.partial
            check_finite_losses(done, epoch=self.epoch, steps_before=step - len(done), steps_per_epoch=ctx.epoch.steps)
        self.progress.close()

    def go_on(self, stage: StageRuntime) -> None:
        """After a transition inside the epoch: go on in ``stage``'s layout from the sampler's position (re-sharded
        for the new layout); the pause is left out of the epoch's seconds and the progress bar's rate."""
        self.prefix.begin_epoch(self.epoch, going_on=True)  # the epoch's cache counters go on
        self.stage = stage
        self.zero_grad = _zero_grad(self.optimizer)  # the new layout's parameters
        stage.forward_timer.collect()
        self.batches = self._read_from(self.next, stage)
        _sync(self.ctx.device)
        pause = time.perf_counter() - self._t_pause
        self.paused += pause
        self.progress.t0 += pause  # the rate counts training time only

    def finish(self, step: int) -> tuple[list[float], dict[str, float], float]:
        """End the epoch (a collective; ``step``: the run's optimizer steps so far).

        Returns:
            The epoch's global losses, the per-step phase seconds (slowest rank; means over the timed steps) with
            ``grad_sync_ops``, ``first_step`` and the cache's counters, and the epoch's seconds.
        """
        ctx, stage, clock, device = self.ctx, self.stage, self.clock, self.ctx.device
        _close(self.batches)  # a stop at max_steps: let a loader's workers go now
        _sync(device)
        seconds = time.perf_counter() - self.t_epoch - self.paused
        stage.forward_timer.active = True
        self.progress.close()
        losses = self.losses
        epoch_losses = losses.global_losses(stage, device)
        losses.partial, losses.local = [], []
        if ctx.config.train.on_nonfinite == "stop":
            steps_before = step - len(epoch_losses)
            check_finite_losses(
                epoch_losses, epoch=self.epoch, steps_before=steps_before, steps_per_epoch=ctx.epoch.steps
            )
        # Timings are reduced with MAX: the slowest rank sets the pace.
        measured = [clock.totals[p] for p in PHASES] + [seconds, float(self.sync_ops), self.first_step_s]
        times = torch.tensor(measured, dtype=torch.float64).to(device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t = times.tolist()
        phase_steps = max(1, clock.timed_steps)
        phases = {p: t[j] / phase_steps for j, p in enumerate(PHASES)}
        phases["grad_sync_ops"] = t[len(PHASES) + 1]
        phases["first_step"] = t[len(PHASES) + 2]
        phases.update(self.prefix.end_epoch())  # the cache's hits, misses and crc failures, summed over the ranks
        return epoch_losses, phases, t[len(PHASES)]
