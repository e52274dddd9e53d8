"""``ElasticTrainer``: the thin, stateful elastic trainer that composes the user's own objects.

Layout. ``W`` processes, one per device, all busy all the time. With pipeline length ``K`` there are ``R = W / K``
replicas; rank ``r`` runs stage ``r % K`` of replica ``r // K`` (:func:`elastic_pipe.groups.plan_spmd`). Stage
``s`` holds the active sub-layers ``boundaries[s]:boundaries[s+1]`` and runs them as a
``torch.distributed.pipelining.PipelineStage`` under the schedule the schedule package generates; gradients are
averaged over the stage's replica group, so replicas stay bit-identical.

The trainer only composes (docs/training.md, "How the trainer is put together", draws it): what it holds, their
lifecycle and state (:mod:`.trainer_base`), components (:mod:`.components`), the rank's fixed facts
(:mod:`.context`, :mod:`.setup`), the run's position (:mod:`.state`), one layout's stage (:mod:`.stage`),
the run's frozen prefix and its activation cache (:mod:`.prefix`), the epoch (:mod:`.step_loop`,
:mod:`.report.losses`, :mod:`.epoch_record`), decision points (:mod:`.layout.executor`, :mod:`.apply_transition`,
:mod:`.layout.rule`), evaluation and state (:mod:`.evaluation`, :mod:`.snapshot`, :mod:`.checkpoint`).

It alone holds and advances the run's position: the step loop returns the steps it ran and why it stopped (the
epoch's end, ``max_steps``, a decision point, a step checkpoint); the trainer decides or saves there and lets it go
on.

Example::

    trainer = ElasticTrainer(config, model=my_model, data=my_samples, policy=MyPolicy(num_layers=12))
    with trainer:
        result = trainer.fit()          # collective: every rank calls it; the same result on every rank
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Unpack

import torch

from elastic_pipe.orchestrator.apply_transition import apply, event_for
from elastic_pipe.orchestrator.components import components_from_config, with_decisions
from elastic_pipe.orchestrator.data import num_samples
from elastic_pipe.orchestrator.epoch_record import finish_epoch
from elastic_pipe.orchestrator.layout import executor
from elastic_pipe.orchestrator.persist import Checkpointer, rerun, snapshot
from elastic_pipe.orchestrator.setup import candidate_pipe_lens, sublayer_costs
from elastic_pipe.orchestrator.step_loop import EpochRun
from elastic_pipe.orchestrator.step_ops import decision_point
from elastic_pipe.orchestrator.trainer_base import TrainerBase

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.components import Overrides
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.orchestrator.report import RunResult, TransitionEvent

__all__ = ["ElasticTrainer", "candidate_pipe_lens", "sublayer_costs"]


class ElasticTrainer(TrainerBase):
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
        compression: a :class:`~elastic_pipe.orchestrator.layout.compression.CompressionRule`.
        schedule: a schedule kind ("gpipe", "1f1b", ...).
        optimizer: ``params -> torch.optim.Optimizer``.
        loss: ``loss(output, target)``, a mean over the micro-batch.
        eval_data: the user's validation set, of the same kind as ``data`` (samples, or a map-style dataset); when
            given, all of ``data`` is trained on. Default: the config's ``[data] eval_dataset``, else
            ``[data] eval_fraction`` of ``data`` held out.
        quiet: no human lines on stderr (records still go to ``[log] dir``).
    """

    def __init__(self, config: TrainConfig, *, quiet: bool = False, **given: Unpack[Overrides]) -> None:
        parts = components_from_config(config, **given)
        # ``[freeze] decide_every = "auto"`` becomes the policy's rhythm in steps: what the run reads from here on
        run_config = with_decisions(config, parts.policy, num_samples(parts.data), own_eval=parts.eval_data is not None)
        super().__init__(parts, run_config, given=config, quiet=quiet, config_optimizer=given.get("optimizer") is None)

    def start(self) -> None:
        """Agree on the initial layout (rank 0 partitions and broadcasts it) and build this rank's stage."""
        self.setup()
        self._enter(executor.initial_state(self.ctx), 0)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole trained model's weights, assembled on request (a collective: replica 0 of every stage sends
        its sub-layers' weights to rank 0, point to point; no other rank gathers anything).

        Returns:
            On rank 0 the model's ``state_dict`` with every tensor on the CPU (a copy: tied tensors come out as
            separate equal tensors, ready for ``safetensors``); ``{}`` on the other ranks. Load it into the model
            the config builds (:func:`~elastic_pipe.orchestrator.components.build_model`).
        """
        return snapshot.full_model(self.ctx, self.state.layout)

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
        c, checkpointer = self.config, self.checkpointer
        if self._state is None and not (checkpointer and c.checkpoint.resume == "auto" and self.resume()):
            self.start()
        elif self.state.epoch >= c.train.epochs or self.step_limit_reached():
            self._already_complete()
        self.result.setup_s = time.perf_counter() - t0
        while self.state.epoch < c.train.epochs and not self.step_limit_reached():
            if self.state.decision_due:  # resumed at a decision point whose decision was not made
                self.transition(epoch_step=self._epoch_step() or 0)
            self.train_epoch(checkpointer)
            if self.step_limit_reached():
                if checkpointer is not None:
                    checkpointer.save(self.state, steps_done=self._epoch_step())
                break
            if self.state.epoch < c.train.epochs and self.state.decision_due:
                self.transition()
            if checkpointer is not None:
                checkpointer.maybe_save(self.state)
            if on_epoch_end is not None:
                on_epoch_end(self)
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def resume(self) -> bool:
        """Continue from the newest checkpoint in ``[checkpoint] dir`` every rank finds intact, if any (a collective;
        sets the trainer up first; :meth:`fit` calls it with ``resume = "auto"``): every part restored by name
        (:meth:`checkpoint_parts`), then the saved layout entered, the saved probe outputs the probe's baseline.
        Says so on stderr (rank 0); returns whether a checkpoint was loaded (never without ``[checkpoint] dir``).
        """
        self.setup()
        checkpointer = self.checkpointer
        if checkpointer is None or (found := checkpointer.find()) is None:  # every check, on every rank, first
            return False
        # a config the checkpoint's run did not have is refused before anything loads (unless allowed)
        changes = rerun.check_config(found.manifest, self.given_config)
        checkpointer.load(found)
        self.prefix.forget()  # the loaded weights are resident
        outputs, self._saved_probe = self._saved_probe, None  # none: a new baseline from the loaded weights
        self._enter(self.state, 0, probe_outputs=outputs)
        self._record_resume(changes)
        if self.ctx.log.stream is not None:  # the file actually loaded, after any fallback
            where = found.path
            self.ctx.log.say(f"resuming from epoch {self.state.epoch + 1} step {self.state.step} ({where})")
        return True

    def _record_resume(self, changes: dict[str, list[object]]) -> None:
        """``events.jsonl``: drop the records of what the resumed run does again, then add a ``resume`` record."""
        log, state = self.ctx.log, self.state
        log.rewind(state.epoch, state.step)
        record = {"kind": "resume", "epoch": state.epoch, "step": state.step, "config_changes": changes}
        log.record(record, f"continuing with a changed config: {rerun.describe(changes)}" if changes else None)

    def train_epoch(self, checkpointer: Checkpointer | None = None) -> None:
        """Run the current epoch (the rest of it, after a mid-epoch resume) and evaluate (a collective).

        The step loop runs steps until it reaches the epoch's end, ``[train] max_steps``, a decision point inside
        the epoch (``[freeze] decide_every``) or a step checkpoint (``[checkpoint] steps``, with ``checkpointer``);
        the trainer advances the run's position by the steps it ran, decides or saves there and lets it go on.
        The epoch stops early at ``max_steps``; it is evaluated every ``[log] eval_every`` epochs, after the run's
        last one and at such a stop (the record's ``eval_loss`` is ``None`` otherwise).
        """
        ctx, c = self.ctx, self.config
        # steps already done in this epoch (a mid-epoch resume); the sampler still counts the previous epoch's
        # steps until the EpochRun starts this one
        first = self._epoch_step() or 0
        run = EpochRun(
            ctx,
            self.stage,
            self.prefix,
            epoch=self.state.epoch,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            sampler=self.sampler,
            losses=self.losses,
            save_every=c.checkpoint.steps if checkpointer is not None else 0,
        )
        while True:
            ran = run.steps(self.state.step)
            self._state = self.state.replace(step=self.state.step + ran.count)
            stopped = self.step_limit_reached()
            if ran.decision and stopped:  # the decision is made first when the run continues
                self._state = self.state.replace(decision_due=True)
            elif ran.decision and self.transition(epoch_step=ran.done, before=lambda: run.pause(self.state.step)):
                run.go_on(self.stage)  # a decision that keeps the layout goes on with the same batches
            if ran.checkpoint and checkpointer is not None:
                checkpointer.maybe_save_step(self.state, ran.done)
            if stopped or not (ran.decision or ran.checkpoint):
                break
        state = self.state
        losses, phases, seconds = run.finish(state.step)
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
        self._credit_layout({"compile": metrics.compile_s, "capture": metrics.capture_s})
        self._fresh_layout = None
        # the runners a transition inside this epoch replaced measured the rest
        earlier, self._spent = self._spent, {"compile": 0.0, "capture": 0.0}
        compile_s, capture_s = metrics.compile_s + earlier["compile"], metrics.capture_s + earlier["capture"]
        metrics = dataclasses.replace(metrics, compile_s=compile_s, capture_s=capture_s)
        self.result.epochs.append(metrics.to_dict())
        if scores[0] is not None:
            self.result.final_accuracy, self.result.final_eval_loss = scores[1], scores[0]
        ctx.log.record(metrics.to_dict(), metrics.human(c.train.epochs))
        if not complete:  # stopped at max_steps: the epoch continues on a resume with a larger limit
            self.losses.partial = losses
            self._state = state
            return
        every = c.freeze.every_steps
        self._state = state.replace(epoch=state.epoch + 1, decision_due=not every or decision_point(state.step, every))

    def _credit_layout(self, spent: dict[str, float]) -> None:
        """Add a runner's compile and capture seconds to the phases of the transition that built its layout: what
        a layout's first steps pay belongs to the transition before (none at the run's start)."""
        if self._fresh_layout is not None:
            phases = self._fresh_layout["phases"]
            for key, value in spent.items():
                phases[key] = round(phases.get(key, 0.0) + value, 6)

    def transition(self, *, epoch_step: int = 0, before: Callable[[], None] | None = None) -> TransitionEvent | None:
        """Decide and apply at the decision point before the current epoch, or inside it after ``epoch_step`` of its
        steps; returns the event when the layout changed (``before`` is called then, before anything moves).

        The policy observes the gradient statistics gathered since the previous decision point and the held-out
        loss of the latest evaluation (evaluations run at epoch ends only).
        """
        ctx, prefix = self.ctx, self.prefix
        state, stage = self.state.replace(decision_due=False), self.stage
        self._state = state
        last = self.result.last_evaluation()
        eval_loss = None if last is None else last["eval_loss"]
        t0 = time.perf_counter()
        msg = executor.decide(ctx, state, stage, prefix=prefix, eval_loss=eval_loss, epoch_step=epoch_step)
        decide_s = time.perf_counter() - t0
        applied = apply(
            ctx, state, stage, msg, optimizer=self.optimizer, prefix=prefix, epoch_step=epoch_step, before=before
        )
        if applied is None:
            return None
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        self._credit_layout(applied.spent)  # the replaced runner's compile and capture, before the new layout's
        self._spent = {k: self._spent[k] + v for k, v in applied.spent.items()}
        self._state, self._stage = applied.state, applied.stage
        self.sampler.reshard(applied.state.layout.replicas, applied.stage.replica)
        event = event_for(msg, applied, decide_s=decide_s, seconds=seconds, epoch_step=epoch_step)
        self._fresh_layout = event.to_dict()
        self.result.transitions.append(self._fresh_layout)
        ctx.log.record(event.to_dict(), event.human())
        return event
