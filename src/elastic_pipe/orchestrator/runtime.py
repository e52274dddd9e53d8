"""One rank's elastic training loop: the SPMD layout, the pipelined step, and transitions at decision points.

Layout. ``W`` processes, one per device, all busy all the time. With pipeline length ``K`` there are ``R = W / K``
replicas; rank ``r`` runs stage ``r % K`` of replica ``r // K`` (:func:`elastic_pipe.groups.plan_spmd`). Stage
``s`` holds the active sub-layers ``boundaries[s]:boundaries[s+1]`` and runs them as a
``torch.distributed.pipelining.PipelineStage`` under the schedule the schedule package generates. After the
pipelined step every rank averages its gradients over its stage's replica group (one all-reduce per bucket), so
replicas stay bit-identical.

Frozen prefix. Every rank holds a copy of the whole model; a frozen sub-layer's weights are broadcast to all ranks
once, when it freezes. Only stage-0 ranks run the frozen prefix (under ``no_grad``, in eval mode) on their own
micro-batches, or read its output from the activation cache when that pays, and feed the result to stage 0. This
keeps every rank busy (no rank is set aside to serve the prefix) and costs no transfer per step.

Semantics. The global batch is fixed: each replica takes ``global_batch / R`` samples per step from the elastic
sampler and the gradient is the mean over the global batch whatever ``R`` is, so the loss curve does not depend on
the layout (the equivalence test checks this in float64). The learning-rate schedule counts optimizer steps and
is unaffected too.

A decision point (the end of every epoch): gather per-layer gradient statistics to rank 0, rank 0 runs the freeze
policy and the compression, encodes a :class:`~elastic_pipe.protocol.TransitionMessage`, broadcasts it on the gloo
control group, and every rank applies it (:meth:`ElasticRun.apply`).

The loop calls out to one module per part: :mod:`.stage` builds the pipeline stage, :mod:`.grad_sync` averages
gradients, :mod:`.prefix_cache` manages the frozen prefix's activation cache, :mod:`.evaluation` scores the model,
:mod:`.optim` builds the optimizer and learning-rate schedule, :mod:`.timing` times the phases, and
:mod:`.transition` moves state between ranks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import cache as acache
from elastic_pipe import data as edata
from elastic_pipe import freeze, partition, protocol
from elastic_pipe.groups import GroupManager
from elastic_pipe.orchestrator import decision
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.evaluation import evaluate_split
from elastic_pipe.orchestrator.faults import FAULT_ENV, maybe_fail
from elastic_pipe.orchestrator.grad_sync import OverlappedAverager, average_gradients
from elastic_pipe.orchestrator.metrics import PHASES, EpochMetrics, EventLog, RunResult, TransitionEvent
from elastic_pipe.orchestrator.optim import lr_lambda, make_optimizer
from elastic_pipe.orchestrator.prefix_cache import FillPeers, prepare_cache
from elastic_pipe.orchestrator.stage import build_runner, example_io, unit_modules
from elastic_pipe.orchestrator.timing import ForwardTimer, PhaseClock, Progress
from elastic_pipe.orchestrator.transition import (
    apply_moves,
    changed_ranks,
    drop_foreign_state,
    owned_sublayers,
    plan_gather,
    plan_moves,
)
from elastic_pipe.orchestrator.workload import Split, cross_entropy
from elastic_pipe.types import Layout

__all__ = ["FAULT_ENV", "ElasticRun", "RunResult", "candidate_pipe_lens", "epoch_seed", "sublayer_costs"]

log = logging.getLogger(__name__)

#: Spacing of (seed, epoch, rank) in :func:`epoch_seed`; larger than any epoch count or world size.
_SEED_STRIDE = 1 << 20
#: The parts of a transition timed separately (seconds on rank 0, in :attr:`TransitionEvent.phases`).
TRANSITION_PHASES = ("moves", "rebuild", "cache")
#: Bytes per MiB (cache budgets are configured in MiB).
MIB = 1 << 20


def candidate_pipe_lens(config: TrainConfig) -> tuple[int, ...]:
    """Every pipeline length the job may reach: divisors of the world size up to the initial length."""
    return tuple(k for k in range(config.pipe_len, 0, -1) if config.world_size % k == 0)


def sublayer_costs(model: nn.Module) -> list[float]:
    """Parameters per sub-layer (the published partition proxy)."""
    return [float(sum(p.numel() for p in m.parameters())) for m in model.children()]


class ElasticRun:
    """One rank's view of an elastic training run.

    Args:
        config: the validated configuration.
        model: a :class:`~elastic_pipe.models.SubLayerModel` (``unit_ends``, ``prefix_len``), already seeded
            identically on every rank; it is moved to ``device``.
        train_set: training split (same on every rank).
        eval_set: evaluation split (same on every rank).
        groups: a :class:`~elastic_pipe.groups.GroupManager` built for :func:`candidate_pipe_lens`.
        device: this rank's device.
        log: where rank 0 writes records and human lines (other ranks pass a silent log).
        loss_fn: ``loss_fn(output, target)``, a mean over the micro-batch.
    """

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        train_set: Split,
        eval_set: Split,
        groups: GroupManager,
        *,
        device: torch.device,
        log: EventLog | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy,
    ) -> None:
        self.config = config
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if self.world_size != config.world_size:
            raise OrchestratorError(
                f"the job has {self.world_size} processes but the config describes {config.world_size}"
            )
        self.device = device
        self.model = model.to(device)
        self.sublayers: list[nn.Module] = list(model.children())
        self.unit_ends: tuple[int, ...] = tuple(model.unit_ends)  # type: ignore[arg-type]
        self.train_set = train_set
        self.eval_set = eval_set
        #: The training split's sample ids on the host, where the cache looks them up: ids on a GPU would
        #: synchronise the host with the device at every cached step.
        self._host_ids = train_set.sample_ids.to("cpu", torch.int64)
        self.groups = groups
        self.log = log or EventLog()
        self.loss_fn = loss_fn
        self.steps_per_epoch = len(train_set) // config.global_batch
        if self.steps_per_epoch < 1:
            raise OrchestratorError(f"global_batch={config.global_batch} exceeds the {len(train_set)} training samples")
        self.costs = sublayer_costs(model)
        if config.cost == "time" and self.rank == 0:  # only rank 0 decides, so only rank 0 profiles
            self.costs = self._profiled_costs()
        self.optimizer = make_optimizer(self.model, config)
        total = config.epochs * self.steps_per_epoch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config, total))
        self.policy = freeze.make_policy(config.policy, len(self.unit_ends), **config.policy_options)
        #: Whether the policy reads gradient statistics: schedules (alpha, FreezeOut, manual: ``needs_stats`` False)
        #: do not, and then no step pays for accumulating them nor any decision for gathering them. A policy that
        #: does not say gets them.
        self._track_gradients = bool(getattr(self.policy, "needs_stats", True))
        self.layout: Layout | None = None
        self.budget = 0.0
        self.frozen_units = 0
        self.epoch = 0
        self.step = 0
        self.result = RunResult()
        self.sampler = edata.ElasticSampler(len(train_set), 1, 0, seed=config.seed, shuffle=True, drop_last=False)
        self._stage_module: nn.Module | None = None
        self._runner: Any = None
        self._tracker: Any = None
        self._fwd_timer: ForwardTimer | None = None
        self._averager: OverlappedAverager | None = None
        self._autocast = config.autocast == "bf16"
        self.cache: acache.ActivationCache | None = None
        if config.cache != "off":
            self.cache = acache.ActivationCache(
                int(self._host_ids.max()) + 1, device_budget=config.cache_mb * MIB, device=device
            )
        self.cache_on = False
        self.cache_reason = "off"
        self.transition_phases: dict[str, float] = {}
        #: Global losses of the current epoch's steps run before a mid-epoch checkpoint this run resumed from.
        self.partial_losses: list[float] = []
        self._epoch_losses: list[torch.Tensor] = []
        self._prefix_memo: tuple[int, torch.Tensor] | None = None
        self._on_step: Callable[[ElasticRun, int], object] | None = None

    # ----------------------------------------------------------------------------------------------------- setup
    def _profiled_costs(self) -> list[float]:
        """Forward + backward seconds per sub-layer on one micro-batch (``partition.profile_layers``)."""
        mb = max(1, self.config.global_batch // self.config.world_size // self.config.microbatches)
        names = getattr(self.model, "layer_names", [str(i) for i in range(len(self.sublayers))])
        example = self.train_set.inputs[:mb].to(self.device)
        costs = partition.weights_from_costs(
            partition.profile_layers(list(zip(names, self.sublayers, strict=True)), example), metric="time"
        )
        for p in self.model.parameters():
            p.grad = None
        return costs

    @property
    def plan(self) -> Any:
        """This layout's rank plan."""
        assert self.layout is not None
        return self.groups.plan(self.layout.pipe_len)

    @property
    def stage(self) -> int:
        """This rank's stage in the current layout."""
        return int(self.plan.stage_of(self.rank))

    @property
    def replica(self) -> int:
        """This rank's replica in the current layout."""
        return int(self.plan.replica_of(self.rank))

    def _owned(self) -> range:
        assert self.layout is not None
        return owned_sublayers(self.layout, self.plan, self.rank)

    def _broadcast_bytes(self, payload: bytes | None, src: int) -> bytes:
        return self.groups.broadcast_bytes(payload, src=src)

    def _announce(self, make: Callable[[], protocol.TransitionMessage]) -> protocol.TransitionMessage:
        return decision.announce(make, rank=self.rank, broadcast_bytes=self._broadcast_bytes)

    def start(self) -> None:
        """Agree on the initial layout (rank 0 partitions and broadcasts it) and build this rank's stage."""

        def initial() -> protocol.TransitionMessage:
            layout, budget = decision.initial_layout(
                self.costs,
                self.config.pipe_len,
                self.world_size,
                solver=self.config.solver,
                microbatches=self.config.microbatches_for(self.config.pipe_len),
            )
            return decision.message_for(layout, epoch=0, step=0, budget=budget, changed=(), grad_norms=None)

        msg = self._announce(initial)
        self.budget = msg.max_cost_at_start
        self.layout = decision.layout_from_message(msg, self.world_size)
        drop_foreign_state(self.optimizer, self.sublayers, self._owned())
        self._build_stage()

    def restore_after_load(self) -> None:
        """After a checkpoint set ``layout`` and the state: fix module modes, drop foreign state, build the stage."""
        self._prefix_memo = None  # the loaded weights are not those it was taken with
        self._restore_modes(True)
        drop_foreign_state(self.optimizer, self.sublayers, self._owned())
        self._build_stage()
        self._setup_cache(0)

    def close(self) -> None:
        """Release what the run holds beyond its results: the hooks it put on the model's parameters and stage (so
        that the model trains on elsewhere without them), and the activation cache's memory. Idempotent."""
        if self._averager is not None:
            self._averager.remove()
            self._averager = None
        if self._fwd_timer is not None:
            self._fwd_timer.remove()
            self._fwd_timer = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None
            self.cache_on = False
        self._runner = None
        self._prefix_memo = None

    def _build_stage(self) -> None:
        """(Re)build this rank's pipeline stage, schedule runner, gradient tracker and data shard."""
        layout = self.layout
        assert layout is not None
        if self._fwd_timer is not None:
            self._fwd_timer.remove()
        k, s = layout.pipe_len, self.stage
        lo, hi = layout.boundaries[s], layout.boundaries[s + 1]
        module = nn.Sequential(*self.sublayers[lo:hi])
        module.train()
        self._runner = build_runner(
            module,
            stage=s,
            pipe_len=k,
            microbatches=layout.microbatches,
            schedule=self.config.schedule,
            device=self.device,
            group=self.groups.pipeline_group(k),
            examples=lambda: self._example_io(lo, hi),
            loss_fn=self.loss_fn,
        )
        self._stage_module = module
        self._fwd_timer = ForwardTimer(module, self.device)
        tracked = unit_modules(self.sublayers, self.unit_ends, lo, hi) if self._track_gradients else {}
        self._tracker = freeze.GradNormTracker(tracked)
        self._build_averager()
        self.sampler.reshard(layout.replicas, self.replica)

    def _build_averager(self) -> None:
        """With one micro-batch and several replicas, gradients are averaged while the backward pass runs."""
        assert self.layout is not None
        if self._averager is not None:
            self._averager.remove()
            self._averager = None
        if self.layout.replicas > 1 and self.layout.microbatches == 1:
            params = [p for j in self._owned() for p in self.sublayers[j].parameters() if p.requires_grad]
            group = self.groups.dp_group(self.layout.pipe_len)
            self._averager = OverlappedAverager(params, group=group, replicas=self.layout.replicas)

    def _run_sublayers(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        with torch.no_grad(), self._autocast_ctx():
            for j in range(lo, hi):
                x = self.sublayers[j](x)
        return x

    def _setup_cache(self, old_frozen: int) -> None:
        """On stage-0 ranks: carry cached entries to the new boundary, then decide whether reading pays."""
        layout = self.layout
        assert layout is not None
        self.cache_on = False
        if self.cache is None or layout.frozen == 0 or self.stage != 0:
            self.cache_reason = "off" if self.cache is None else "nothing to cache here"
            return
        self.cache_on, self.cache_reason = prepare_cache(
            self.cache,
            self.train_set,
            mode=self.config.cache,
            old_frozen=old_frozen,
            frozen=layout.frozen,
            per_replica=self.config.global_batch // layout.replicas,
            # A replica's batch per forward: the shapes the training step's prefix forward already ran (kernels
            # chosen, memory known to fit); larger chunks measured slower on the first fill (2x H200).
            chunk=self.config.global_batch // layout.replicas,
            device=self.device,
            run=self._run_sublayers,
            peers=self._fill_peers(),
            example=self._prefix_example(layout.frozen),
        )

    def _fill_peers(self) -> FillPeers | None:
        """The replicas' stage-0 ranks, which split the cache's pass over the training split between them."""
        assert self.layout is not None
        if self.layout.replicas == 1:
            return None
        group = self.groups.dp_group(self.layout.pipe_len)
        return FillPeers(group, dist.get_rank(group), self.layout.replicas)

    def _example_io(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Example micro-batch tensors at the stage's input and output, run in eval mode (no dropout)."""
        assert self.layout is not None
        mb = self.config.global_batch // self.layout.replicas // self.layout.microbatches
        start = min(lo, self.layout.frozen)
        x = self._prefix_example(start)
        was = self.model.training
        self.model.eval()
        stage_in, stage_out = example_io(self.sublayers, x, lo, hi, self._autocast_ctx, rows=mb, start=start)
        self._restore_modes(was)
        return stage_in, stage_out

    def _prefix_example(self, frozen: int) -> torch.Tensor:
        """The output of the frozen sub-layers ``0:frozen`` on one training sample (eval mode).

        Memoised: frozen weights never change, so a later, larger boundary runs only the sub-layers frozen since.
        """
        memo = self._prefix_memo
        if memo is None or memo[0] > frozen:
            memo = (0, self.train_set.inputs[:1].to(self.device))
        if memo[0] < frozen:
            memo = (frozen, self._run_sublayers(memo[1], memo[0], frozen))
        self._prefix_memo = memo
        return memo[1]

    def _restore_modes(self, training: bool) -> None:
        """Back to ``training`` mode, except the frozen prefix, which always runs in eval mode (no dropout)."""
        self.model.train(training)
        if self.layout is not None:
            for m in self.sublayers[: self.layout.frozen]:
                m.eval()

    def _autocast_ctx(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast)

    # ------------------------------------------------------------------------------------------------- training
    def _frozen_prefix(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        assert self.layout is not None
        frozen = self.layout.frozen
        if frozen == 0:
            return x
        if self.cache_on and self.cache is not None:
            return self.cache.get_or_compute(ids, frozen, x, lambda v: self._run_sublayers(v, 0, frozen))
        return self._run_sublayers(x, 0, frozen)

    def _grad_sync(self) -> int:
        """Average the stage's gradients over its replica group; returns the number of all-reduce calls."""
        assert self.layout is not None
        replicas = self.layout.replicas
        if replicas == 1:
            return 0
        if self._averager is not None:
            return self._averager.finish()
        group = self.groups.dp_group(self.layout.pipe_len)
        grads = [p.grad for j in self._owned() for p in self.sublayers[j].parameters() if p.grad is not None]
        return average_gradients(grads, group=group, replicas=replicas)

    def train_epoch(self) -> EpochMetrics:
        """Run one epoch of pipelined steps in the current layout; returns its metrics (same on every rank)."""
        layout = self.layout
        assert layout is not None and self._runner is not None and self._fwd_timer is not None
        c = self.config
        k, s = layout.pipe_len, self.stage
        per_replica = c.global_batch // layout.replicas
        self.sampler.set_epoch(self.epoch)  # the same epoch again keeps the sampler's progress (mid-epoch resume)
        # Random ops in training (dropout) draw from generators seeded by (seed, epoch, rank): reproducible across
        # restarts at epoch granularity, and independent between ranks.
        torch.manual_seed(epoch_seed(c.seed, self.epoch, self.rank))
        first = self.sampler.consumed // c.global_batch
        clock = PhaseClock(self.device)
        sync_ops = 0
        # Per-step losses stay on the device until the epoch ends: reading one would synchronise every step.
        losses: list[torch.Tensor] = []
        self._epoch_losses = losses
        no_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._fwd_timer.collect()
        self._sync_device()
        t_epoch = time.perf_counter()
        progress = Progress(self.steps_per_epoch, f"epoch {self.epoch + 1}/{c.epochs}", enabled=self._show())
        for i in range(first, self.steps_per_epoch):
            maybe_fail("step", self.rank, self.epoch, i)
            timed = self.device.type != "cuda" or _timed_step(
                i - first, self.steps_per_epoch - first, c.timing_interval
            )
            self._fwd_timer.active = timed
            clock.start(timed=timed)
            host_idx = torch.tensor(self.sampler.step_indices(c.global_batch), dtype=torch.long)
            idx = host_idx
            if self.device.type == "cuda":  # a pinned index copies without waiting for the queued work
                idx = idx.pin_memory().to(self.device, non_blocking=True)
            if idx.numel() != per_replica:
                raise OrchestratorError(
                    f"the sampler ran dry at step {i} of epoch {self.epoch}: got {idx.numel()} of {per_replica} indices"
                )
            x = self.train_set.inputs[idx].to(self.device, non_blocking=True) if s == 0 else None
            y = self.train_set.labels[idx].to(self.device, non_blocking=True) if s == k - 1 else None
            clock.lap("data")
            if x is not None:
                x = self._frozen_prefix(x, self._host_ids[host_idx])
            prefix_s = clock.lap("forward")
            step_losses: list[torch.Tensor] = []
            with self._autocast_ctx():
                if k == 1:
                    self._runner.step(x, target=y, losses=step_losses)
                elif s == 0:
                    self._runner.step(x)
                elif s == k - 1:
                    self._runner.step(target=y, losses=step_losses)
                else:
                    self._runner.step()
            step_s = clock.lap("backward")
            if timed:
                fwd = min(self._fwd_timer.collect(), step_s)
                clock.totals["forward"] += fwd
                clock.totals["backward"] -= fwd
            del prefix_s
            sync_ops += self._grad_sync()
            clock.lap("grad_sync")
            self._tracker.accumulate()  # holds no layers when the policy does not read their statistics
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.sampler.advance(c.global_batch)
            self.step += 1
            clock.lap("optimizer")
            losses.append(torch.stack([t.detach().double() for t in step_losses]).mean() if step_losses else no_loss)
            progress.update(i + 1)
            if self._on_step is not None and i + 1 < self.steps_per_epoch:
                self._on_step(self, i + 1)
        self._sync_device()
        seconds = time.perf_counter() - t_epoch
        self._fwd_timer.active = True
        progress.close()
        # Per-step losses live on the last stage of each replica; their sum over the world, divided by R, is the
        # global loss. Timings are reduced with MAX: the slowest rank sets the pace.
        step_losses_global = self.losses_so_far()
        self.partial_losses = []
        self.result.losses.extend(step_losses_global)
        times = torch.tensor(
            [clock.totals[p] for p in PHASES] + [seconds, float(sync_ops)], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t = times.tolist()
        n = self.steps_per_epoch
        steps_run = max(1, n - first)  # steps run by this attempt
        phase_steps = max(1, clock.timed_steps)
        eval_loss, eval_acc = self.evaluate()
        seconds = t[len(PHASES)]
        ops = int(t[len(PHASES) + 1])
        return EpochMetrics(
            epoch=self.epoch,
            steps=n,
            samples=n * c.global_batch,
            seconds=seconds,
            samples_per_s=steps_run * c.global_batch / seconds if seconds > 0 else 0.0,
            loss=float(sum(step_losses_global) / n),
            eval_loss=eval_loss,
            eval_accuracy=eval_acc,
            data_s=t[0] / phase_steps,
            forward_s=t[1] / phase_steps,
            backward_s=t[2] / phase_steps,
            grad_sync_s=t[3] / phase_steps,
            optimizer_s=t[4] / phase_steps,
            grad_sync_ops=ops,
            grad_sync_ops_per_s=ops / seconds if seconds > 0 else 0.0,
            pipe_len=k,
            replicas=layout.replicas,
            frozen_units=self.frozen_units,
            frozen_sublayers=layout.frozen,
            microbatches=layout.microbatches,
            cache=self.cache_on,
            lr=float(self.optimizer.param_groups[0]["lr"]),
        )

    def losses_so_far(self) -> list[float]:
        """Global losses of the current epoch's steps so far (a collective).

        Each step's loss lives on the last stage of each replica; the sum over the world divided by the replica
        count is the global loss.
        """
        assert self.layout is not None
        if self._epoch_losses:
            local = torch.stack(self._epoch_losses).to(torch.float64)
        else:
            local = torch.zeros(0, dtype=torch.float64, device=self.device)
        if self.stage != self.layout.pipe_len - 1:
            local.zero_()
        dist.all_reduce(local)
        return self.partial_losses + (local / self.layout.replicas).tolist()

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _show(self) -> bool:
        return self.rank == 0 and self.config.progress

    # ----------------------------------------------------------------------------------------------- evaluation
    def sync_weights(self, *, with_optimizer: bool = False, keep_all_on: int | None = None) -> int:
        """Make every rank's copy of every active sub-layer current (a collective); returns the bytes moved.

        Args:
            with_optimizer: also send optimizer state (for a checkpoint).
            keep_all_on: the rank that keeps every received optimizer state (the others keep their own only).
        """
        assert self.layout is not None
        owned = self._owned()
        return apply_moves(
            plan_gather(self.layout, self.plan),
            self.sublayers,
            self.optimizer if with_optimizer else None,
            rank=self.rank,
            device=self.device,
            keep_state=lambda j: self.rank == keep_all_on or j in owned,
            broadcast_bytes=self._broadcast_bytes,
        )

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float | None]:
        """Loss and accuracy of the whole model on the evaluation split; each rank scores a 1/W share."""
        self.sync_weights()
        was = self.model.training
        self.model.eval()
        scores = evaluate_split(
            self.model,
            self.eval_set,
            self.loss_fn,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            autocast=self._autocast_ctx,
        )
        self._restore_modes(was)
        return scores

    # ----------------------------------------------------------------------------------------------- transition
    def _gather_stats(self) -> Any:
        """Per-unit gradient statistics of the epoch, merged on rank 0 (``None`` elsewhere, and on every rank when
        the policy does not read them)."""
        assert self._tracker is not None
        if not self._track_gradients:
            return None
        n_units = len(self.unit_ends)
        mine = self._tracker.local_stats(n_units)
        if self.replica != 0:  # replicas hold identical (all-reduced) gradients: replica 0 speaks for all
            mine = freeze.LayerStats.zeros(n_units, mine.steps)
        flat = mine.to_tensor()
        group = self.groups.control_group
        pieces = [torch.zeros_like(flat) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(flat, pieces, dst=0, group=group)
        self._tracker.reset()
        if pieces is None:
            return None
        return freeze.merge_stats([freeze.LayerStats.from_tensor(p) for p in pieces])

    def decide(self, epoch: int) -> protocol.TransitionMessage:
        """The decision point before ``epoch``: gather stats, decide on rank 0, broadcast; returns the message."""
        assert self.layout is not None
        stats = self._gather_stats()
        current = self.layout

        def next_message() -> protocol.TransitionMessage:
            if stats is not None:
                self.policy.observe(stats)
            units = freeze.decide(self.policy, epoch, self.step, self.frozen_units)
            min_active = current.pipe_len if self.config.compression == "none" else 1
            units = min(units, decision.max_frozen_units(self.unit_ends, len(self.sublayers), min_active))
            units = max(units, self.frozen_units)
            frozen = 0 if units == 0 else self.unit_ends[units - 1]
            layout = decision.next_layout(
                current,
                frozen,
                self.costs,
                compression=self.config.compression,
                solver=self.config.solver,
                budget=self.budget,
                world_size=self.world_size,
                microbatches_for=self.config.microbatches_for,
            )
            changed = changed_ranks(self.plan, self.groups.plan(layout.pipe_len), self.world_size)
            return decision.message_for(
                layout,
                epoch=epoch,
                step=self.step,
                budget=self.budget,
                changed=changed,
                grad_norms=None if stats is None else stats.mean_l2(),
            )

        return self._announce(next_message)

    def apply(self, msg: protocol.TransitionMessage) -> tuple[int, bool]:
        """Apply a decoded message on this rank (a collective); returns (bytes moved, whether anything changed)."""
        old = self.layout
        assert old is not None
        new = decision.layout_from_message(msg, self.world_size)
        if new == old:
            return 0, False
        maybe_fail("transition", self.rank, msg.epoch, None)
        clock = PhaseClock(self.device, TRANSITION_PHASES)
        clock.start()
        new_plan = self.groups.plan(new.pipe_len)
        new_owned = owned_sublayers(new, new_plan, self.rank)
        moves = plan_moves(old, new, self.plan, new_plan)
        moved = apply_moves(
            moves,
            self.sublayers,
            self.optimizer,
            rank=self.rank,
            device=self.device,
            keep_state=lambda j: j in new_owned,
            broadcast_bytes=self._broadcast_bytes,
        )
        clock.lap("moves")
        newly_frozen = self.sublayers[old.frozen : new.frozen]
        if newly_frozen:
            freeze.freeze_modules(newly_frozen, self.optimizer)
        self.layout = new
        self._restore_modes(True)
        self.frozen_units = sum(1 for end in self.unit_ends if end <= new.frozen)
        drop_foreign_state(self.optimizer, self.sublayers, new_owned)
        self._build_stage()
        clock.lap("rebuild")
        self._setup_cache(old.frozen)
        clock.lap("cache")
        self.transition_phases.update(clock.totals)
        return moved, True

    def transition(self, epoch: int) -> TransitionEvent | None:
        """Decide and apply at the decision point before ``epoch``; returns the event when the layout changed."""
        t0 = time.perf_counter()
        msg = self.decide(epoch)
        self.transition_phases = {"decide": time.perf_counter() - t0}
        moved, changed = self.apply(msg)
        if not changed:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        assert self.layout is not None
        event = TransitionEvent(
            epoch=epoch,
            step=self.step,
            frozen_units=self.frozen_units,
            frozen=self.layout.frozen,
            pipe_len=self.layout.pipe_len,
            replicas=self.layout.replicas,
            microbatches=self.layout.microbatches,
            boundaries=tuple(self.layout.boundaries),
            changed_ranks=tuple(msg.changed_ranks),
            bytes_moved=moved,
            cache=self.cache_on,
            seconds=seconds,
            phases={k: round(v, 6) for k, v in self.transition_phases.items()},
        )
        self.result.transitions.append(event.to_dict())
        self.log.record(event.to_dict(), event.human())
        return event

    # ------------------------------------------------------------------------------------------------------ run
    def fit(
        self,
        *,
        on_epoch_end: Callable[[ElasticRun], object] | None = None,
        on_step: Callable[[ElasticRun, int], object] | None = None,
    ) -> RunResult:
        """Train from ``self.epoch`` to ``config.epochs``, with a decision point after every epoch but the last.

        Args:
            on_epoch_end: called on every rank after each epoch's transition (checkpointing hooks in here).
            on_step: called on every rank after each step but an epoch's last, with the steps done in the epoch.
        """
        t0 = time.perf_counter()
        self._on_step = on_step
        if self.layout is None:
            self.start()
        while self.epoch < self.config.epochs:
            metrics = self.train_epoch()
            self.result.epochs.append(metrics.to_dict())
            self.result.final_accuracy = metrics.eval_accuracy
            self.result.final_eval_loss = metrics.eval_loss
            self.log.record(metrics.to_dict(), metrics.human(self.config.epochs))
            self.epoch += 1
            if self.epoch < self.config.epochs:
                self.transition(self.epoch)
            if on_epoch_end is not None:
                on_epoch_end(self)
        self.result.seconds = time.perf_counter() - t0
        return self.result


def _timed_step(done: int, steps: int, interval: int) -> bool:
    """Whether step ``done`` (0-based) of an epoch's ``steps`` is split into phases: every ``interval``-th step,
    never the first (it carries the warm-up of a new layout), and the last when the epoch is shorter than that."""
    return done % interval == interval - 1 or (done == steps - 1 and steps < interval)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of a rank's random generators (CPU and CUDA) for one epoch: distinct for every (epoch, rank)."""
    return (seed * _SEED_STRIDE + epoch) * _SEED_STRIDE + rank
