"""One epoch of pipelined steps in one layout, and the epoch's global losses.

Semantics. The global batch is fixed: each replica takes ``global_batch / R`` samples per step from the elastic
sampler and the gradient is the mean over the global batch whatever ``R`` is, so the loss curve does not depend on
the layout (the equivalence test checks this in float64). The learning-rate schedule counts optimizer steps and
is unaffected too.

Decision points inside an epoch (``[freeze] decide_every = N``): after every step that brings the run's step count
to a multiple of ``N`` (but an epoch's last, which the trainer decides after the epoch's evaluation), the loop hands
over to a :data:`DecisionHook`, which decides and applies the transition, and continues the epoch in the layout it
returns: the losses of the steps so far are reduced in the old layout, the batches are read anew from the sampler's
position (re-sharded by the transition), and the transition's time is left out of the epoch's seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe.orchestrator.data import Batch, ElasticBatchSampler
from elastic_pipe.orchestrator.errors import NonFiniteLossError, OrchestratorError
from elastic_pipe.orchestrator.evaluation import evaluate
from elastic_pipe.orchestrator.launch import maybe_fail
from elastic_pipe.orchestrator.metrics import PHASES, EpochMetrics
from elastic_pipe.orchestrator.stage import StageRuntime, step_record
from elastic_pipe.orchestrator.state import RunState
from elastic_pipe.orchestrator.timing import PhaseClock, Progress

if TYPE_CHECKING:
    from elastic_pipe import data as edata
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import FrozenPrefix

__all__ = [
    "DecisionHook",
    "EpochLosses",
    "StepHook",
    "check_finite_losses",
    "clip_global_grad_norm",
    "decision_point",
    "epoch_metrics",
    "finish_epoch",
    "reseed",
    "run_epoch",
    "step_loss",
    "step_seed",
]


#: Called after each step but an epoch's last, with the state after the step and the steps done in the epoch.
StepHook = Callable[[RunState, int], object]

#: Called at a decision point inside an epoch with the state after the step and the steps done in the epoch; makes
#: the decision (a collective) and returns the state and the stage the epoch continues with.
DecisionHook = Callable[[RunState, int], tuple[RunState, StageRuntime]]


def decision_point(step: int, every: int) -> bool:
    """Whether a decision point follows the run's ``step``-th optimizer step with ``[freeze] decide_every = every``
    (0: only epoch ends are decision points, which the trainer handles)."""
    return every > 0 and step > 0 and step % every == 0


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """The seed of a rank's random generators (CPU and CUDA) for one step of an epoch (``step`` counts from 0).

    A function of the step's coordinates alone, so a run resumed at any step draws that step's dropout masks
    exactly as the uninterrupted run did, whatever it drew before; distinct for every (seed, epoch, step, rank)
    up to the 2**-64 chance of a hash collision, with no bound on any coordinate. 64 bits of BLAKE2b.
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def reseed(seed: int, device: torch.device) -> None:
    """Seed the generators a rank's step draws from: the CPU's and, on a GPU, the rank's device's.

    What ``torch.manual_seed`` leaves in those two generators, without its work on every other backend: it seeds
    every CUDA device, MPS, XPU and MTIA as well, and on a host where CUDA is not initialised (any CPU run) it
    queues the CUDA seeding with a formatted stack trace, about 0.6 ms per step on the CPU
    (``benchmarks/bench_head_only_host.py``). A rank draws only on its own device and the CPU.
    """
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


def step_loss(losses: list[torch.Tensor], none: torch.Tensor) -> torch.Tensor:
    """A step's loss to keep on the device: the mean of its micro-batch losses in float64 (``none``: no loss on
    this rank). One micro-batch's loss is kept as it is (no copy; :meth:`EpochLosses.global_losses` widens it to
    float64 exactly as the mean of one would)."""
    if len(losses) == 1:
        return losses[0].detach()
    return torch.stack([t.detach().double() for t in losses]).mean() if losses else none


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


@dataclass
class EpochLosses:
    """The current epoch's per-step losses: on the device while it runs (reading one would synchronise every
    step), plus the global losses of steps run before a mid-epoch checkpoint this run resumed from."""

    partial: list[float] = field(default_factory=list)
    local: list[torch.Tensor] = field(default_factory=list)

    def global_losses(self, stage: StageRuntime, device: torch.device) -> list[float]:
        """Global losses of the epoch's steps so far (a collective).

        Each step's loss lives on the last stage of each replica; the sum over the world divided by the replica
        count is the global loss.
        """
        if self.local:
            wide = [t.to(torch.float64) for t in self.local] if len({t.dtype for t in self.local}) > 1 else self.local
            mine = torch.stack(wide).to(torch.float64)
        else:
            mine = torch.zeros(0, dtype=torch.float64, device=device)
        if not stage.is_last:
            mine.zero_()
        dist.all_reduce(mine)
        return self.partial + (mine / stage.layout.replicas).tolist()

    def fold(self, stage: StageRuntime, device: torch.device) -> None:
        """Reduce the losses on the device into :attr:`partial` while ``stage``'s layout is current (a collective):
        before a transition inside the epoch, whose new layout puts the losses on other ranks."""
        self.partial, self.local = self.global_losses(stage, device), []


def check_finite_losses(losses: list[float], *, epoch: int, steps_before: int, steps_per_epoch: int) -> None:
    """Stop at the first NaN or infinite global loss among an epoch's steps so far (``[train] on_nonfinite``).

    Called where the losses already come back to the host - the epoch's end, and before a transition inside the
    epoch (:meth:`EpochLosses.fold`) - so the check adds no device-to-host synchronisation to any step; a non-finite
    step is found at the latest at its epoch's end, before that state is checkpointed or a decision made on it.
    The losses are global (the same on every rank), so every rank raises the same error.

    Args:
        losses: the epoch's global losses, from its first step on (0-based step ``j`` at ``losses[j]``).
        epoch: the epoch (0-based).
        steps_before: optimizer steps of the run before the epoch's first.
        steps_per_epoch: the epoch's steps.

    Raises:
        NonFiniteLossError: naming the epoch, the step in it and in the run, and the value.
    """
    for j, value in enumerate(losses):
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"training loss is {value} at epoch {epoch + 1}, step {j + 1} of {steps_per_epoch} (step "
                f"{steps_before + j + 1} of the run); the run stops (set train.on_nonfinite = 'continue' to train on)"
            )


@torch.no_grad()
def clip_global_grad_norm(stage: StageRuntime, max_norm: float, device: torch.device) -> float:
    """Scale this rank's gradients so that the whole model's gradient has L2 norm at most ``max_norm`` (a collective).

    The norm is global: each rank of replica 0 sums the squares of the gradients of the sub-layers it owns (after
    the replica average every replica holds the same ones, so the others add nothing), one all-reduce over the
    world adds the stages up, and every rank scales by the same factor, as ``torch.nn.utils.clip_grad_norm_``
    would on the whole model in one process.

    Returns:
        The global norm before clipping.
    """
    grads = [p.grad for j in stage.owned for p in stage.ctx.sublayers[j].parameters() if p.grad is not None]
    square = torch.zeros((), dtype=torch.float64, device=device)
    if grads and stage.replica == 0:
        square = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]).square().sum()
    dist.all_reduce(square)
    norm = float(square.sqrt())
    # torch's clip_grad_norm_ rule: the 1e-6 keeps the factor finite at a zero norm
    factor = min(1.0, max_norm / (norm + 1e-6))
    if factor < 1.0 and grads:
        torch._foreach_mul_(grads, factor)
    return norm


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


def run_epoch(
    ctx: RunContext,
    state: RunState,
    stage: StageRuntime,
    prefix: FrozenPrefix,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler: edata.ElasticSampler,
    losses: EpochLosses,
    on_step: StepHook | None = None,
    on_decision: DecisionHook | None = None,
) -> tuple[RunState, list[float], dict[str, float], float]:
    """Run the rest of ``state.epoch``, starting in ``stage``'s layout (a collective).

    Args:
        on_step: called after each step but the epoch's last (after the step's decision point, if any).
        on_decision: makes the decision at each decision point inside the epoch (``[freeze] decide_every``);
            ``None``: none is made. A ``max_steps`` stop at a decision point marks the state ``decision_due``.

    Returns:
        The state after the epoch's last step, the epoch's global losses, the per-step phase seconds (slowest
        rank; means over the timed steps) with ``grad_sync_ops``, and the epoch's seconds.
    """
    c, device, layout = ctx.config, ctx.device, stage.layout
    plan = ctx.epoch
    every = c.freeze.every_steps
    steps_per_epoch = plan.steps
    sampler.set_epoch(state.epoch)  # the same epoch again keeps the sampler's progress (mid-epoch resume)
    first = plan.steps_done(sampler.consumed)
    first_step_s = 0.0

    # The rest of the epoch's batches, read from the sampler's position in this layout (a data loader's workers
    # read ahead); only stage 0 needs inputs, only the last stage labels.
    def read_from(step: int, stage: StageRuntime) -> Iterator[Batch]:
        # with the cache on, each step's lookup starts a step ahead
        return prefix.batches(
            ctx.train_set.batches(
                ElasticBatchSampler(sampler, plan.sizes(step)),
                inputs=prefix.needs_inputs,
                labels=stage.is_last,
                device=device,
            )
        )

    prefix.begin_epoch(state.epoch)
    batches = read_from(first, stage)
    clock = PhaseClock(device)
    sync_ops = 0
    paused = 0.0  # seconds spent in transitions inside the epoch
    losses.local = []
    no_loss = torch.zeros((), dtype=torch.float64, device=device)
    zero_grad = _zero_grad(optimizer)
    seed, rank, host_ids = c.train.seed, ctx.rank, ctx.host_ids
    timer = stage.forward_timer
    timer.collect()
    _sync(device)
    t_epoch = time.perf_counter()
    label = f"epoch {state.epoch + 1}/{c.train.epochs}"
    stream = ctx.log.stream
    progress = Progress(
        steps_per_epoch, label, enabled=stream is not None and c.log.progress, start=first, stream=stream
    )
    max_steps = c.train.max_steps
    stop_nonfinite = c.train.on_nonfinite == "stop"

    for i in range(first, steps_per_epoch):
        if max_steps and state.step >= max_steps:
            break
        maybe_fail("step", ctx.rank, state.epoch, i)
        # Random ops in training (dropout) draw from generators reseeded at every step from (seed, epoch, step,
        # rank): a resume from any step checkpoint reproduces the masks, and ranks draw independently.
        # reseed sets the CPU generator and the rank's device's, as torch.manual_seed would (and nothing else).
        reseed(step_seed(seed, state.epoch, i, rank), device)
        timed = device.type != "cuda" or _timed_step(i - first, steps_per_epoch - first, c.log.timing_interval)
        timer.active = timed
        clock.start(timed=timed)
        size = plan.size(i)
        host_idx, x, y = next(batches, _NO_BATCH)
        if host_idx.numel() != size // layout.replicas:
            raise OrchestratorError(
                f"the sampler ran dry at step {i} of epoch {state.epoch}: got {host_idx.numel()} of "
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
        state = state.replace(step=state.step + 1)
        clock.lap("optimizer")
        losses.local.append(step_loss(step_losses, no_loss))
        if i == first:  # the layout's warm-up (and, compiled, its compilation) lands in the first step
            _sync(device)
            first_step_s = time.perf_counter() - t_epoch
        progress.update(i + 1)
        inside = i + 1 < steps_per_epoch
        stopped = bool(max_steps) and state.step >= max_steps
        if inside and on_decision is not None and decision_point(state.step, every):
            if stopped:  # the decision is made first when the run continues
                state = state.replace(decision_due=True)
            else:
                t_pause = time.perf_counter()
                _close(batches)
                losses.fold(stage, device)
                if stop_nonfinite:  # the losses read back so far start at the epoch's first step
                    done = losses.partial
                    check_finite_losses(
                        done, epoch=state.epoch, steps_before=state.step - len(done), steps_per_epoch=steps_per_epoch
                    )
                progress.close()
                state, stage = on_decision(state, i + 1)
                prefix.begin_epoch(state.epoch, going_on=True)  # the epoch's cache counters go on
                layout, timer = stage.layout, stage.forward_timer
                zero_grad = _zero_grad(optimizer)  # the new layout's parameters
                timer.collect()
                batches = read_from(i + 1, stage)  # the sampler's position, re-sharded for the new layout
                _sync(device)
                pause = time.perf_counter() - t_pause
                paused += pause
                progress.t0 += pause  # the rate counts training time only
        if on_step is not None and inside and not stopped:
            on_step(state, i + 1)
    _close(batches)  # a stop at max_steps: let a loader's workers go now
    _sync(device)
    seconds = time.perf_counter() - t_epoch - paused
    timer.active = True
    progress.close()
    epoch_losses = losses.global_losses(stage, device)
    losses.partial, losses.local = [], []
    if stop_nonfinite:
        steps_before = state.step - len(epoch_losses)
        check_finite_losses(epoch_losses, epoch=state.epoch, steps_before=steps_before, steps_per_epoch=steps_per_epoch)
    # Timings are reduced with MAX: the slowest rank sets the pace.
    measured = [clock.totals[p] for p in PHASES] + [seconds, float(sync_ops), first_step_s]
    times = torch.tensor(measured, dtype=torch.float64).to(device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    t = times.tolist()
    phase_steps = max(1, clock.timed_steps)
    phases = {p: t[j] / phase_steps for j, p in enumerate(PHASES)}
    phases["grad_sync_ops"] = t[len(PHASES) + 1]
    phases["first_step"] = t[len(PHASES) + 2]
    phases.update(prefix.end_epoch())  # the cache's hits, misses and crc failures, summed over the ranks
    return state, epoch_losses, phases, t[len(PHASES)]


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
    """The record of an epoch from what :func:`run_epoch` measured and the evaluation's scores."""
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
    collective) and build the epoch's record from what :func:`run_epoch` measured.

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
