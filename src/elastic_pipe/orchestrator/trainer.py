"""``ElasticTrainer``: the thin, stateful elastic trainer that composes the user's own objects.

Layout. ``W`` processes, one per device, all busy all the time. With pipeline length ``K`` there are ``R = W / K``
replicas; rank ``r`` runs stage ``r % K`` of replica ``r // K`` (:func:`elastic_pipe.groups.plan_spmd`). Stage
``s`` holds the active sub-layers ``boundaries[s]:boundaries[s+1]`` and runs them as a
``torch.distributed.pipelining.PipelineStage`` under the schedule the schedule package generates; gradients are
averaged over the stage's replica group, so replicas stay bit-identical.

The trainer only composes (docs/training.md, "How the trainer is put together", draws it): components
(:mod:`.components`), the rank's fixed facts (:mod:`.context`, :mod:`.setup`), the run's position (:mod:`.state`),
one layout's stage (:mod:`.stage`), the run's frozen prefix and its activation cache (:mod:`.prefix`), the
epoch (:mod:`.step_loop`), decision points (:mod:`.executor`, :mod:`.layout_rule`), evaluation and state
(:mod:`.evaluation`, :mod:`.snapshot`, :mod:`.checkpoint`).

Example::

    trainer = ElasticTrainer(config, model=my_model, data=my_samples, policy=MyPolicy(num_layers=12))
    with trainer:
        result = trainer.fit()          # collective: every rank calls it; the same result on every rank
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import data as edata
from elastic_pipe import freeze, partition
from elastic_pipe.models.weights import check_materializable
from elastic_pipe.orchestrator import executor, holdings
from elastic_pipe.orchestrator.components import Components, components_from_config, with_decisions
from elastic_pipe.orchestrator.data import DatasetSplit, Loss, Samples, num_samples
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.launch import join_process_group
from elastic_pipe.orchestrator.metrics import RunResult, TransitionEvent
from elastic_pipe.orchestrator.optim import OptimizerFactory, lr_lambda
from elastic_pipe.orchestrator.persist import Checkpointer, rerun, snapshot
from elastic_pipe.orchestrator.prefix import FrozenPrefix
from elastic_pipe.orchestrator.setup import (
    build_context,
    candidate_pipe_lens,
    check_memory_budget,
    check_untied_stages,
    sublayer_costs,
)
from elastic_pipe.orchestrator.stage import StageRuntime, probe
from elastic_pipe.orchestrator.step_loop import (
    EpochLosses,
    StepHook,
    check_finite_losses,
    decision_point,
    finish_epoch,
    run_epoch,
)

if TYPE_CHECKING:
    from elastic_pipe.groups import GroupManager
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.layout_rule import CompressionRule
    from elastic_pipe.orchestrator.state import RunState

__all__ = ["ElasticTrainer", "candidate_pipe_lens", "sublayer_costs"]


class ElasticTrainer:
    """One rank's elastic training run, composed from built parts.

    Every component not given is built from ``config`` (:func:`components_from_config`).

    Args:
        config: the run's numbers (epochs, batch, layout, launch, checkpoint, log).
        model: a :class:`~elastic_pipe.models.SubLayerModel`: with real weights, seeded identically on every rank,
            or on the meta device with a ``sublayer_init`` (:mod:`elastic_pipe.models.weights`), from which each
            rank materializes only the sub-layers it holds. Default: the config's model, built on the meta device.
        data: samples held in memory (``inputs``, ``labels``, ``sample_ids``), or any map-style dataset of
            ``(input, label)`` (a ``torch.utils.data.Dataset``), read through a ``DataLoader`` with ``[data] workers``
            workers and never stacked into memory.
        policy: any :class:`~elastic_pipe.freeze.FreezePolicy` over the model's units, an object with only
            ``num_layers`` and ``propose`` (a :class:`~elastic_pipe.freeze.Policy` subclass, say: the other members
            get defaults), or a function ``(epoch, step, current) -> int``. ``num_layers`` must be the model's
            units (``len(model.unit_ends)``).
        partitioner: a partition solver name or function (``partition.optimal``).
        compression: a :class:`~elastic_pipe.orchestrator.layout_rule.CompressionRule`.
        schedule: a schedule kind ("gpipe", "1f1b", ...).
        optimizer: ``params -> torch.optim.Optimizer``.
        loss: ``loss(output, target)``, a mean over the micro-batch.
        eval_data: the user's validation set, of the same kind as ``data`` (samples, or a map-style dataset); when
            given, all of ``data`` is trained on. Default: the config's ``[data] eval_dataset``, else
            ``[data] eval_fraction`` of ``data`` held out.
        quiet: no human lines on stderr (records still go to ``[log] dir``).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        model: nn.Module | None = None,
        data: Samples | Any = None,
        policy: freeze.PolicyLike | None = None,
        partitioner: str | partition.Solver | None = None,
        compression: CompressionRule | None = None,
        schedule: str | None = None,
        optimizer: OptimizerFactory | None = None,
        loss: Loss | None = None,
        eval_data: Samples | Any = None,
        quiet: bool = False,
    ) -> None:
        self.parts: Components = components_from_config(
            config,
            model=model,
            data=data,
            policy=policy,
            partitioner=partitioner,
            compression=compression,
            schedule=schedule,
            optimizer=optimizer,
            loss=loss,
            eval_data=eval_data,
        )
        # ``[freeze] decide_every = "auto"`` becomes the policy's rhythm in steps: what the run reads from here on
        self.config = with_decisions(
            config, self.parts.policy, num_samples(self.parts.data), own_eval=self.parts.eval_data is not None
        )
        #: The config as given: what a checkpoint keeps and a resume compares with (:mod:`.rerun`).
        self.given_config = config
        self.quiet = quiet
        #: Whether the optimizer is the config's own (then AdamW runs fused once the parameters are on a GPU).
        self._config_optimizer = optimizer is None
        self.result = RunResult()
        self._ctx: RunContext | None = None
        self._state: RunState | None = None
        self._stage: StageRuntime | None = None
        self._owns_group = False
        self._groups: GroupManager | None = None
        self._prefix: FrozenPrefix | None = None
        self.losses = EpochLosses()
        #: The result's record of the latest transition until the epoch after it ends (which adds the compilation
        #: and graph capture its first steps paid to the record's phases).
        self._fresh_layout: dict[str, Any] | None = None

    # ---------------------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> ElasticTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def setup(self) -> None:
        """Join the process group (from the torchrun environment, unless one exists), build the groups, the
        optimizer and the data splits (a collective). :meth:`fit` calls it; idempotent."""
        if self._ctx is not None:
            return
        c = self.config
        check_materializable(self.parts.model)  # all three before any process group forms
        check_untied_stages(c, self.parts.model)
        check_memory_budget(c, self.parts.model)
        self._owns_group = join_process_group(c)
        ctx = build_context(c, self.parts, quiet=self.quiet)
        self._groups = ctx.groups
        model = ctx.model
        make = self.parts.optimizer
        assert make is not None  # components_from_config fills it
        # Built over the whole model (on the meta device, or the CPU), so every parameter's group is known; the
        # optimizer then covers only what this rank owns (holdings.point_optimizer, at every layout).
        self.optimizer = make([p for p in model.parameters() if p.requires_grad])
        ctx = self._ctx = dataclasses.replace(ctx, param_group_of=holdings.param_groups_by_name(self.optimizer, model))
        total = c.train.epochs * self.steps_per_epoch
        if c.train.max_steps:
            total = min(total, c.train.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(c.train, total))
        self.sampler = edata.ElasticSampler(len(ctx.train_set), 1, 0, seed=c.train.seed, shuffle=True, drop_last=False)
        self._prefix = FrozenPrefix.build(ctx)

    def start(self) -> None:
        """Agree on the initial layout (rank 0 partitions and broadcasts it) and build this rank's stage."""
        self.setup()
        self._enter(executor.initial_state(self.ctx), 0)

    def _enter(
        self, state: RunState, old_frozen: int, *, probe_outputs: Mapping[str, Mapping[str, torch.Tensor]] | None = None
    ) -> None:
        """Make ``state`` current: hold only its sub-layers, point the optimizer at them, build the stage, carry
        the cache; the probe's baseline is ``probe_outputs`` (a checkpoint's, :func:`.probe.restore`) when given, a
        new one taken now (a collective) otherwise."""
        ctx, prefix = self.ctx, self.prefix
        served = prefix.cache_complete  # whether the layout left held every sample's prefix output (no inputs read)
        if self._stage is not None:
            self._stage.close()
        holdings.hold(ctx, state.layout)
        ctx.restore_modes(state.layout, True)
        holdings.point_optimizer(ctx, self.optimizer, state.layout)
        if self._config_optimizer:
            holdings.fuse_on_device(self.optimizer)
        self._state = state
        self._stage = StageRuntime(ctx, state.layout)
        if isinstance(ctx.train_set, DatasetSplit):
            # the steps' loader workers start now, beside the probe and the cache's set-up, not at the first step
            # (the cache's set-up decides whether inputs are read; a cache that served every sample goes on to)
            ctx.train_set.start_steps(
                inputs=self._stage.is_first and not served,
                labels=self._stage.is_last,
                device=ctx.device,
                shard=(state.layout.replicas, self._stage.replica),
            )
        if probe_outputs is None:
            probe.baseline(ctx, self._stage, prefix)  # a probe-driven policy's first comparison starts here
        else:  # a checkpoint's: the comparison spans the whole interval, as in the run that wrote it
            probe.restore(ctx, self._stage, probe_outputs)
        prefix.enter(state.layout, old_frozen)
        self.sampler.reshard(state.layout.replicas, self._stage.replica)

    def close(self) -> None:
        """Release what the trainer holds beyond its results: the stage's hooks on the model, the activation
        cache, a dataset's loader workers, and the process groups it created (the default group too, when it
        joined it). Idempotent."""
        if self._stage is not None:
            self._stage.close()
            self._stage = None
        if self._prefix is not None:
            self._prefix.close()
        if self._ctx is not None:
            for part in (self._ctx.train_set, self._ctx.eval_set):
                getattr(part, "close", lambda: None)()  # a dataset's kept loaders: their workers go
            self._ctx.log.close()
        if self._groups is not None:
            self._groups.destroy()
            self._groups = None
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    # ---------------------------------------------------------------------------------------------- properties
    @property
    def ctx(self) -> RunContext:
        """This rank's fixed facts (after :meth:`setup`)."""
        if self._ctx is None:
            raise OrchestratorError("the trainer is not set up: call fit(), start() or setup() first")
        return self._ctx

    @property
    def prefix(self) -> FrozenPrefix:
        """This rank's frozen prefix and its activation cache (after :meth:`setup`)."""
        if self._prefix is None:
            raise OrchestratorError("the trainer is not set up: call fit(), start() or setup() first")
        return self._prefix

    @property
    def state(self) -> RunState:
        """Where the run stands (after :meth:`start`)."""
        if self._state is None:
            raise OrchestratorError("the trainer has no layout yet: call fit() or start() first")
        return self._state

    @property
    def stage(self) -> StageRuntime:
        """This rank's stage in the current layout (after :meth:`start`)."""
        if self._stage is None:
            raise OrchestratorError("the trainer has no stage yet: call fit() or start() first")
        return self._stage

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch, a short last step included (:func:`.data.epoch_plan`)."""
        return self.ctx.epoch.steps

    def step_limit_reached(self) -> bool:
        """Whether the run has taken ``[train] max_steps`` optimizer steps (never when it is 0)."""
        limit = self.config.train.max_steps
        return bool(limit) and self.state.step >= limit

    # -------------------------------------------------------------------------------------------------- train
    def fit(self, *, on_epoch_end: Callable[[ElasticTrainer], object] | None = None) -> RunResult:
        """Train to ``train.epochs`` (a collective), with a decision point after every epoch but the last, or, with
        ``[freeze] decide_every = N``, after every N-th optimizer step of the run but its last (inside an epoch, too).

        Checkpoints are written and resumed as ``[checkpoint]`` says. A run resumed from its last epoch's
        checkpoint with more ``epochs`` makes the decision it skipped there first, so it reshapes as a run of that
        length would have. With ``[train] max_steps`` the run stops after that many steps (inside an epoch, too)
        with an evaluation and, when checkpoints are on, a checkpoint; a decision point there is decided first
        when the run continues.

        Args:
            on_epoch_end: called on every rank after each epoch's transition.
        """
        t0 = time.perf_counter()
        self.setup()
        c = self.config
        checkpointer = Checkpointer(c) if c.checkpoint.dir else None
        if self._state is None and not (checkpointer and c.checkpoint.resume == "auto" and self._resume(checkpointer)):
            self.start()
        elif self.state.epoch >= c.train.epochs or self.step_limit_reached():
            self._already_complete()
        self.result.setup_s = time.perf_counter() - t0
        on_step: StepHook | None = None
        if checkpointer is not None:

            def on_step(state: RunState, done: int) -> None:
                self._state = state  # the record of the step just finished, which a checkpoint saves
                checkpointer.maybe_save_step(self, done)

        while self.state.epoch < c.train.epochs and not self.step_limit_reached():
            if self.state.decision_due:  # resumed at a decision point whose decision was not made
                self.transition(epoch_step=self._epoch_step() or 0)
            self.train_epoch(on_step)
            if self.step_limit_reached():
                if checkpointer is not None:
                    checkpointer.save(self, steps_done=self._epoch_step())
                break
            if self.state.epoch < c.train.epochs and self.state.decision_due:
                self.transition()
            if checkpointer is not None:
                checkpointer.maybe_save(self)
            if on_epoch_end is not None:
                on_epoch_end(self)
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def _epoch_step(self) -> int | None:
        """Steps of the current epoch done (a mid-epoch position), or ``None`` at an epoch's end (the sampler still
        counts the finished epoch until the next one starts)."""
        if self.sampler.epoch != self.state.epoch:
            return None
        return self.ctx.epoch.steps_done(self.sampler.consumed)

    def _decide_inside(self, state: RunState, done: int) -> tuple[RunState, StageRuntime]:
        """The decision point after step ``done`` of the current epoch (``[freeze] decide_every``; a collective)."""
        self._state = state
        self.transition(epoch_step=done)
        return self.state, self.stage

    def _latest_eval_loss(self) -> float | None:
        """The held-out loss of the run's latest evaluation (``None`` before the first)."""
        return next((e["eval_loss"] for e in reversed(self.result.epochs) if e["eval_loss"] is not None), None)

    def _already_complete(self) -> None:
        """A resumed run with nothing left to train: say so, and report the last evaluation it made (not NaN)."""
        c = self.config
        meta = {"epoch": self.state.epoch, "step": self.state.step}
        self.ctx.log.say(rerun.already_complete(meta, c) or "run already complete")
        last = next((e for e in reversed(self.result.epochs) if e["eval_loss"] is not None), None)
        if last is not None:
            self.result.final_eval_loss, self.result.final_accuracy = last["eval_loss"], last["eval_accuracy"]

    def _resume(self, checkpointer: Checkpointer) -> bool:
        """Load the newest checkpoint, if any, and say so on stderr (rank 0)."""
        found = checkpointer.find(self)  # every check, on every rank, before anything loads
        if found is None:
            return False
        # a config the checkpoint's run did not have is refused before anything loads (unless allowed)
        changes = rerun.check_config(found.manifest, self.given_config)
        self.load_state_dict(found.state)
        self._record_resume(changes)
        if self.ctx.log.stream is not None:  # the file actually loaded, after any fallback
            where = found.path
            self.ctx.log.say(f"resuming from epoch {self.state.epoch + 1} step {self.state.step} ({where})")
        return True

    def _record_resume(self, changes: dict[str, list[Any]]) -> None:
        """``events.jsonl``: drop the records of what the resumed run does again, then add a ``resume`` record."""
        log, state = self.ctx.log, self.state
        log.rewind(state.epoch, state.step)
        record = {"kind": "resume", "epoch": state.epoch, "step": state.step, "config_changes": changes}
        log.record(record, f"continuing with a changed config: {rerun.describe(changes)}" if changes else None)

    def train_epoch(self, on_step: StepHook | None = None) -> None:
        """Run the current epoch (the rest of it, after a mid-epoch resume) and evaluate (a collective).

        The epoch stops early at ``[train] max_steps``; it is evaluated every ``[log] eval_every`` epochs, after
        the run's last one and at such a stop (the record's ``eval_loss`` is ``None`` otherwise).
        """
        ctx, c = self.ctx, self.config
        # steps already done in this epoch (a mid-epoch resume); the sampler still counts the previous epoch's
        # steps until run_epoch starts this one
        first = self._epoch_step() or 0
        state, losses, phases, seconds = run_epoch(
            ctx,
            self.state,
            self.stage,
            self.prefix,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            sampler=self.sampler,
            losses=self.losses,
            on_step=on_step,
            on_decision=self._decide_inside,
        )
        done = ctx.epoch.steps_done(self.sampler.consumed)
        complete = done >= self.steps_per_epoch
        metrics, scores = finish_epoch(
            ctx,
            state,
            self.stage,
            self.prefix,
            done=done,
            first=first,
            losses=losses,
            phases=phases,
            seconds=seconds,
            lr=float(self.optimizer.param_groups[0]["lr"]),
        )
        # one loss per step of the run: a run resumed after a max_steps stop inside this epoch already holds the
        # losses of its first steps, which ``losses`` repeats
        del self.result.losses[state.step - len(losses) :]
        self.result.losses.extend(losses)
        self.result.epochs.append(metrics.to_dict())
        if self._fresh_layout is not None:  # what the layout's first steps paid belongs to the transition before
            self._fresh_layout["phases"].update(
                compile=round(metrics.compile_s, 6), capture=round(metrics.capture_s, 6)
            )
            self._fresh_layout = None
        if scores[0] is not None:
            self.result.final_accuracy, self.result.final_eval_loss = scores[1], scores[0]
        ctx.log.record(metrics.to_dict(), metrics.human(c.train.epochs))
        if not complete:  # stopped at max_steps: the epoch continues on a resume with a larger limit
            self.losses.partial = losses
            self._state = state
            return
        every = c.freeze.every_steps
        self._state = state.replace(epoch=state.epoch + 1, decision_due=not every or decision_point(state.step, every))

    @property
    def decision_due(self) -> bool:
        """Whether a decision point was reached and not decided yet (:attr:`RunState.decision_due`)."""
        return self.state.decision_due

    def transition(self, *, epoch_step: int = 0) -> TransitionEvent | None:
        """Decide and apply at the decision point before the current epoch, or inside it after ``epoch_step`` of its
        steps; returns the event when the layout changed.

        The policy observes the gradient statistics gathered since the previous decision point and the held-out
        loss of the latest evaluation (evaluations run at epoch ends only).
        """
        ctx = self.ctx
        self._state = self.state.replace(decision_due=False)
        msg, applied, decide_s, seconds = executor.timed_decision(
            ctx,
            self.state,
            self.stage,
            prefix=self.prefix,
            optimizer=self.optimizer,
            eval_loss=self._latest_eval_loss(),
            epoch_step=epoch_step,
        )
        if applied is None:
            return None
        self._state, self._stage = applied.state, applied.stage
        self.sampler.reshard(applied.state.layout.replicas, applied.stage.replica)
        event = executor.event_for(msg, applied, decide_s=decide_s, seconds=seconds, epoch_step=epoch_step)
        self._fresh_layout = event.to_dict()
        self.result.transitions.append(self._fresh_layout)
        ctx.log.record(event.to_dict(), event.human())
        return event

    # -------------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """This rank's share of what the run needs to continue (a collective: the epoch's losses are summed).

        Returns:
            On every rank the run's position and the trainer's state, the weights of the sub-layers this rank
            holds and the optimizer state of the parameters it owns (tensors on the CPU, plain data otherwise), and,
            for a probe-driven policy, ``probe``: the probe outputs this rank keeps (:func:`.probe.kept`). No rank
            receives another's optimizer state; a checkpoint writes one share per stage.
        """
        ctx = self.ctx
        epoch_losses = self.losses.global_losses(self.stage, ctx.device)
        if self.config.train.on_nonfinite == "stop":  # never checkpoint a state trained past a non-finite loss
            before = self.state.step - len(epoch_losses)
            check_finite_losses(
                epoch_losses, epoch=self.state.epoch, steps_before=before, steps_per_epoch=ctx.epoch.steps
            )
        extra: dict[str, Any] = {
            "scheduler": self.scheduler.state_dict(),
            "policy": self.parts.policy.state_dict(),
            "sampler": self.sampler.state_dict(),
            "history": self.result.history(),
            "epoch_losses": epoch_losses,
        }
        kept = probe.kept(self.stage)  # a probe-driven policy's baseline: replica 0's outputs, by stage
        if kept is not None:
            extra["probe"] = kept
        return snapshot.local_state(ctx, self.state, self.optimizer, extra=extra)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole trained model's weights, assembled on request (a collective: replica 0 of every stage sends
        its sub-layers' weights to rank 0, point to point; no other rank gathers anything).

        Returns:
            On rank 0 the model's ``state_dict`` with every tensor on the CPU (a copy: tied tensors come out as
            separate equal tensors, ready for ``safetensors``); ``{}`` on the other ranks. Load it into the model
            the config builds (:func:`~elastic_pipe.orchestrator.components.build_model`).
        """
        return snapshot.full_model(self.ctx, self.state.layout)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state (after :meth:`setup`): every rank passes a state holding at least its share
        in the saved layout - a sharded checkpoint's lazy view (:class:`~.checkpoint_files.ShardedCheckpoint`), or
        one whole state. Saved probe outputs (``probe``) become the probe's baseline; a state without them (older
        checkpoints) takes a new baseline from the loaded weights."""
        ctx = self.ctx
        run_state = snapshot.restore(ctx, self.optimizer, state)
        self.prefix.forget()  # the loaded weights are resident
        self.scheduler.load_state_dict(state["scheduler"])
        self.parts.policy.load_state_dict(state["policy"])
        self.sampler.load_state_dict(state["sampler"])
        self.result.load_history(state["history"])
        self.losses = EpochLosses(partial=[float(v) for v in state.get("epoch_losses", [])])
        if "decision_due" not in state["run"]:  # checkpoints that kept the flag beside the run's position
            run_state = run_state.replace(decision_due=bool(state.get("decision_due", False)))
        self._enter(run_state, 0, probe_outputs=state.get("probe"))
