"""What an :class:`~.trainer.ElasticTrainer` holds: built, entered, saved, loaded and released.

The components (:mod:`.components`), the rank's fixed facts (:class:`~.context.RunContext`, built in
:meth:`TrainerBase.setup` with the optimizer, the learning-rate schedule, the elastic sampler and the frozen prefix),
the run's position (:class:`~.state.RunState`), this rank's stage in the current layout
(:class:`~.stage.StageRuntime`, entered with :meth:`TrainerBase._enter`), the epoch's losses and the run's
result. A checkpoint saves and restores them as named parts (:meth:`TrainerBase.checkpoint_parts`, the map the
:class:`~.persist.Checkpointer` is built with in :meth:`TrainerBase.setup`); :meth:`TrainerBase.close` releases
what they hold.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeVar

import torch
import torch.distributed as dist

from elastic_pipe import data as edata
from elastic_pipe import freeze
from elastic_pipe.models.weights import check_materializable
from elastic_pipe.orchestrator.data import DatasetSplit, close_splits
from elastic_pipe.orchestrator.errors import OrchestratorError
from elastic_pipe.orchestrator.launch import join_process_group
from elastic_pipe.orchestrator.optim import lr_scheduler
from elastic_pipe.orchestrator.persist import Checkpointer, Part, rerun, snapshot
from elastic_pipe.orchestrator.prefix import FrozenPrefix
from elastic_pipe.orchestrator.report import EpochLosses, RunResult, check_finite_losses, seconds_into
from elastic_pipe.orchestrator.setup import build_context, check_memory_budget, check_untied_stages
from elastic_pipe.orchestrator.stage import StageRuntime, probe
from elastic_pipe.orchestrator.transition import holdings

if TYPE_CHECKING:
    from elastic_pipe.groups import GroupManager
    from elastic_pipe.orchestrator.components import Components
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.persist import Stateful
    from elastic_pipe.orchestrator.state import RunState, RunStateRecord
    from elastic_pipe.types import Layout

__all__ = ["TrainerBase"]

_T = TypeVar("_T")
_NOT_SET_UP = "the trainer is not set up: call fit(), start() or setup() first"


def _held(part: _T | None, missing: str) -> _T:
    """``part``, or :class:`OrchestratorError` ``missing`` while the trainer does not hold it yet."""
    if part is None:
        raise OrchestratorError(missing)
    return part


#: What a part loads from a checkpoint written before the part was kept: no partial losses, no probe outputs (a new
#: baseline is taken from the loaded weights), no inference record (a resume never reads it).
OLDER: dict[str, object] = {"epoch_losses": (), "inference": None, "probe": None}


class TrainerBase:
    """The parts an elastic trainer holds, their lifecycle and their state (the named parts of a checkpoint);
    :class:`~.trainer.ElasticTrainer` documents the arguments."""

    def __init__(
        self, parts: Components, config: TrainConfig, *, given: TrainConfig, quiet: bool, config_optimizer: bool
    ) -> None:
        """Hold ``parts`` (built by :func:`~.components.components_from_config`) for a run of ``config`` (its
        decision rhythm resolved, :func:`~.components.with_decisions`); ``given``: the config as given."""
        self.parts = parts
        self.config = config
        #: The config as given: what a checkpoint keeps and a resume compares with (:mod:`.rerun`).
        self.given_config = given
        self.quiet = quiet
        #: Whether the optimizer is the config's own (then AdamW runs fused once the parameters are on a GPU).
        self._config_optimizer = config_optimizer
        self.result = RunResult()
        self._ctx: RunContext | None = None
        self._state: RunState | None = None
        self._stage: StageRuntime | None = None
        self._owns_group = False
        self._groups: GroupManager | None = None
        self._prefix: FrozenPrefix | None = None
        #: Saves and restores the run's parts (after :meth:`setup`, with ``[checkpoint] dir``; ``None`` without).
        self.checkpointer: Checkpointer | None = None
        #: A checkpoint's probe outputs, from its load until the layout it saved is entered.
        self._saved_probe: Mapping[str, Mapping[str, torch.Tensor]] | None = None
        #: Whether the loaded position's layout was re-cut to the config's ``[pipeline] virtual``.
        self._recut = False
        self.losses = EpochLosses()
        #: The result's record of the latest transition until the epoch after it ends (which adds the compilation
        #: and graph capture its first steps paid to the record's phases).
        self._fresh_layout: dict[str, Any] | None = None
        #: Compile and capture seconds of the runners replaced inside the current epoch (its record adds them).
        self._spent: dict[str, float] = {"compile": 0.0, "capture": 0.0}

    # ---------------------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> Self:
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
        self.scheduler = lr_scheduler(self.optimizer, c.train, self.steps_per_epoch)
        self.sampler = edata.ElasticSampler(len(ctx.train_set), 1, 0, seed=c.train.seed, shuffle=True, drop_last=False)
        self._prefix = FrozenPrefix.build(ctx)
        if c.checkpoint.dir:
            parts = self.checkpoint_parts()
            older = {k: v for k, v in OLDER.items() if k in parts}
            self.checkpointer = Checkpointer(c, self.ctx, parts, defaults=older, given=self.given_config)

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
        prefix.enter(state.layout, old_frozen, step=state.step)
        self.sampler.reshard(state.layout.replicas, self._stage.replica)

    def close(self) -> None:
        """Release what the trainer holds beyond its results: the stage's hooks on the model, the activation
        cache, a dataset's loader workers, and the process groups it created (the default group too, when it
        joined it). Idempotent. The seconds each part took add up in the result's ``close_phases``."""
        closing = functools.partial(seconds_into, self.result.close_phases)
        with closing("stage"):
            if self._stage is not None:
                self._stage.close()
                self._stage = None
        with closing("cache"):
            if self._prefix is not None:
                self._prefix.close()
        if self._ctx is not None:
            with closing("loaders"):  # a dataset's kept loaders: their workers go
                close_splits((self._ctx.train_set, self._ctx.eval_set))
            with closing("log"):
                self._ctx.log.close()
        with closing("groups"):
            if self._groups is not None:
                self._groups.destroy()
                self._groups = None
        with closing("process_group"):
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()
                self._owns_group = False

    # ---------------------------------------------------------------------------------------------- properties
    @property
    def ctx(self) -> RunContext:
        """This rank's fixed facts (after :meth:`setup`)."""
        return _held(self._ctx, _NOT_SET_UP)

    @property
    def prefix(self) -> FrozenPrefix:
        """This rank's frozen prefix and its activation cache (after :meth:`setup`)."""
        return _held(self._prefix, _NOT_SET_UP)

    @property
    def state(self) -> RunState:
        """Where the run stands (after :meth:`start`)."""
        return _held(self._state, "the trainer has no layout yet: call fit() or start() first")

    @property
    def stage(self) -> StageRuntime:
        """This rank's stage in the current layout (after :meth:`start`)."""
        return _held(self._stage, "the trainer has no stage yet: call fit() or start() first")

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch, a short last step included (:func:`.data.epoch_plan`)."""
        return self.ctx.epoch.steps

    def step_limit_reached(self) -> bool:
        """Whether the run has taken ``[train] max_steps`` optimizer steps (never when it is 0)."""
        limit = self.config.train.max_steps
        return bool(limit) and self.state.step >= limit

    def _epoch_step(self) -> int | None:
        """Steps of the current epoch done (a mid-epoch position), or ``None`` at an epoch's end (the sampler still
        counts the finished epoch until the next one starts)."""
        if self.sampler.epoch != self.state.epoch:
            return None
        return self.ctx.epoch.steps_done(self.sampler.consumed)

    @property
    def decision_due(self) -> bool:
        """Whether a decision point was reached and not decided yet (:attr:`RunState.decision_due`)."""
        return self.state.decision_due

    def _already_complete(self) -> None:
        """A resumed run with nothing left to train: say so, and report the last evaluation it made (not NaN)."""
        c = self.config
        meta = {"epoch": self.state.epoch, "step": self.state.step}
        self.ctx.log.say(rerun.already_complete(meta, c) or "run already complete")
        last = self.result.last_evaluation()
        if last is not None:
            self.result.final_eval_loss, self.result.final_accuracy = last["eval_loss"], last["eval_accuracy"]

    # -------------------------------------------------------------------------------------------------- state
    def checkpoint_parts(self) -> dict[str, Stateful]:
        """What a checkpoint saves and restores, by the name each part keeps in the files (after :meth:`setup`).

        Loaded in this order: the run's position first (``run``), which says the layout the weights (``model``)
        and this rank's optimizer state (``optimizer``, after the frozen prefix left the optimizer) are placed by;
        then the RNG state, the inference record (never read back), the learning-rate scheduler, the freeze policy,
        the sampler's position, the history, the epoch's losses so far and, for a probe-driven policy, the probe
        outputs kept for the next decision point (``probe``, the baseline when the saved layout is entered).
        Saving takes ``epoch_losses`` with a collective (the losses are summed) and refuses a state trained past a
        non-finite loss (``[train] on_nonfinite = "stop"``).
        """
        ctx = self.ctx

        def layout() -> Layout:
            return self.state.layout

        parts: dict[str, Stateful] = {
            "run": Part(lambda: self.state.to_dict(), self._load_position),  # noqa: PLW0108 (the state at a save)
            "rng": snapshot.RngState(),
            "model": snapshot.Weights(ctx, layout),
            "optimizer": snapshot.OptimizerShare(ctx, self.optimizer, layout),
            "inference": snapshot.InferenceRecord(ctx),
            "scheduler": self.scheduler,
            "policy": self.parts.policy,
            "sampler": self.sampler,
            "history": Part(self.result.history, self.result.load_history),
            "epoch_losses": Part(self._global_losses, self._load_losses),
        }
        if freeze.needs_probe(self.parts.policy):  # replica 0's outputs, by stage
            parts["probe"] = Part(lambda: probe.kept(self.stage), self._keep_probe)
        return parts

    def _load_position(self, saved: RunStateRecord) -> None:
        self._state = snapshot.position(self.ctx, saved)
        # the config's v differs from the checkpoint's: the layout was re-cut, the probe outputs are regrouped
        self._recut = self._state.layout.virtual != int(saved["layout"].get("virtual", 1))

    def _global_losses(self) -> list[float]:
        """The epoch's global losses so far (a collective), refused when one is not finite and the run stops there."""
        ctx = self.ctx
        epoch_losses = self.losses.global_losses(self.stage, ctx.device)
        if self.config.train.on_nonfinite == "stop":  # never checkpoint a state trained past a non-finite loss
            before = self.state.step - len(epoch_losses)
            check_finite_losses(
                epoch_losses, epoch=self.state.epoch, steps_before=before, steps_per_epoch=ctx.epoch.steps
            )
        return epoch_losses

    def _load_losses(self, saved: Sequence[float]) -> None:
        self.losses = EpochLosses(partial=[float(v) for v in saved])

    def _keep_probe(self, saved: Mapping[str, Mapping[str, torch.Tensor]] | None) -> None:
        if saved is not None and self._recut:
            saved = snapshot.regroup_probe(saved, self.state.layout, self.ctx.unit_ends)
        self._saved_probe = saved
