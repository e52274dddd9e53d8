"""Checkpoints: everything a run needs to continue, one shard per pipeline stage plus a main file, with manifests.

What is saved is :meth:`ElasticTrainer.state_dict`, each rank's share: the rank running stage ``s`` of replica 0
writes the shard of stage ``s`` (the weights of the sub-layers it holds - the frozen prefix too on stage 0 - the
optimizer state of the parameters it owns, by name, and, for a probe-driven freeze policy, the probe outputs it
keeps for the next decision point: :mod:`~elastic_pipe.orchestrator.stage.probe`); rank 0 then writes the main file:
the optimizer's hyper-parameters, the learning-rate scheduler, the freeze policy's state, the sampler's position,
the RNG state, the run's position (:class:`~elastic_pipe.orchestrator.state.RunState`: layout, budget, epoch,
step), the history so far and the shard table (each shard's file and SHA-256, and which shard keeps each stage's
probe outputs). No rank receives another stage's weights or optimizer state.

Files in ``[checkpoint] dir`` (shared by every rank that writes a shard)::

    epoch-0002.stage-0000.shard           stage 0's shard (torch.save), and its manifest:
    epoch-0002.stage-0000.manifest.json   its SHA-256, a CRC-32 per tensor
    epoch-0002.pt                         the main file: the run's state and the shard table
    epoch-0002.manifest.json              its SHA-256, a CRC-32 per tensor, epoch, step, model fingerprint
    latest.json                           names the newest checkpoint's main file

Every file is written to ``NAME.tmp``, flushed and fsynced, renamed over ``NAME``, and the directory is fsynced,
so a crash leaves either the old file or the new one; the shards first (then a barrier), then the main file, its
manifest and ``latest.json``, so ``latest.json`` never names a checkpoint with a shard missing. A save first
deletes ``.tmp`` files a crashed save left, and with ``keep_last = N`` deletes all but the newest N checkpoints
(shards included) afterwards.

Loading uses ``torch.load(..., weights_only=True)``: tensors, numbers, strings, lists and dicts only; no object is
ever unpickled. Before that the main file's and every shard's SHA-256 must match their manifests; after it, every
tensor's CRC-32 must, every floating-point value must be finite and within
:data:`~elastic_pipe.orchestrator.persist.integrity.MAX_ABS` (unless ``allow_nonfinite``), and the manifest's model
fingerprint (names and shapes of its parameters) must be the model's. Every check runs before anything is loaded
into the run: each rank checks the main file and a share of the shards (whole), and the ranks agree
(:meth:`Checkpointer.find`). A checkpoint any rank finds wrong is skipped on every rank with a warning naming it and
the reason, and the newest older one that passes is loaded instead; when none passes the run stops (it never
starts afresh over checkpoints; ``resume = 'never'`` does). A directory holding only another model's checkpoints is
refused before any process starts.

A run resumes into the same world size or a different one, and any layout: the layout's pipeline length must
divide the new world size; the replica count follows, the sampler re-shards from its saved position, and each rank
reads from the shards (memory-mapped) only the weights it holds and the optimizer state of the parameters it owns
(and replica 0's ranks their stage's probe outputs, the probe's baseline: the next drift measured is the
uninterrupted run's; an older checkpoint without them takes the baseline from its weights).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.persist.files import (
    FORMATS,
    Fingerprint,
    JsonObject,
    Latest,
    SavedState,
    prune,
    remove_leftovers,
    shard_digests,
    shard_name,
    write_checkpoint,
    write_shard,
)
from elastic_pipe.orchestrator.persist.loads import candidates, load_verified
from elastic_pipe.orchestrator.persist.shards import verify_shards
from elastic_pipe.orchestrator.transition import held_sublayers

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.state import RunState

__all__ = ["Checkpointable", "Checkpointer", "Found", "check_compatible", "fingerprint"]

log = logging.getLogger(__name__)


def fingerprint(model: nn.Module) -> Fingerprint:
    """Names and shapes of the model's parameters and buffers (what must match for a checkpoint to fit)."""
    state = model.state_dict()
    return {"names": list(state), "shapes": [list(t.shape) for t in state.values()]}


def check_compatible(meta: Mapping[str, Any], model: nn.Module, source: str) -> None:
    """Refuse a checkpoint made for another model.

    Args:
        meta: the checkpoint's manifest or ``latest.json`` as read (JSON, not yet checked).
        model: this run's model.
        source: what to name in the error (the file or the directory).

    Raises:
        ConfigError: if the format or the model fingerprint differs.
    """
    if meta.get("format") not in FORMATS:
        raise ConfigError(f"{source}: checkpoint format {meta.get('format')!r}, expected one of {list(FORMATS)}")
    mine = fingerprint(model)
    theirs = meta.get("fingerprint", {})
    if theirs != mine:
        names = set(theirs.get("names", []))
        diff = (
            sorted(names.symmetric_difference(mine["names"]))[:3]
            or [n for n, a, b in zip(mine["names"], mine["shapes"], theirs.get("shapes", []), strict=False) if a != b][
                :3
            ]
        )
        raise ConfigError(
            f"{source}: checkpoint is from another model ({len(names)} tensors vs {len(mine['names'])}; "
            f"first differences: {diff}); use another checkpoint directory or resume = 'never'"
        )


class Checkpointable(Protocol):
    """What a :class:`Checkpointer` needs of a run (an :class:`~elastic_pipe.orchestrator.ElasticTrainer` is one)."""

    #: The config as given (what a checkpoint keeps, and a resume compares with).
    given_config: TrainConfig

    @property
    def ctx(self) -> RunContext:
        """The rank's fixed facts: rank, groups, model, the layout's plan, the sub-layers' keys."""
        ...

    @property
    def state(self) -> RunState:
        """Where the run stands."""
        ...

    def state_dict(self) -> SavedState:
        """This rank's share of the run's state (a collective)."""
        ...

    def load_state_dict(self, state: SavedState) -> None:
        """Continue from a saved state."""
        ...


@dataclass(frozen=True, slots=True)
class Found:
    """A checkpoint every rank found intact: its state (lazy views of its shards), its manifest and its file."""

    state: SavedState
    manifest: JsonObject
    path: Path


class Checkpointer:
    """Saves a run (an :class:`ElasticTrainer`) every ``[checkpoint] every`` epochs and resumes it.

    It only writes and reads files: the state comes from the run's ``state_dict`` and goes back through its
    ``load_state_dict`` (:class:`Checkpointable`).

    Args:
        config: the run's configuration (``[checkpoint] dir`` must be set).
    """

    def __init__(self, config: TrainConfig) -> None:
        if not config.checkpoint.dir:
            raise ConfigError("a Checkpointer needs [checkpoint] dir")
        self.config = config
        self.directory = Path(config.checkpoint.dir)
        #: The checkpoint file the last :meth:`resume` loaded (after any fallback), or ``None``.
        self.loaded: Path | None = None

    def maybe_save(self, trainer: Checkpointable) -> bool:
        """Save if the epoch just finished is due (a collective); returns whether a checkpoint was written."""
        epoch = trainer.state.epoch
        if epoch % self.config.checkpoint.every and epoch != self.config.train.epochs:
            return False
        self.save(trainer)
        return True

    def maybe_save_step(self, trainer: Checkpointable, steps_done: int) -> bool:
        """Save inside an epoch every ``[checkpoint] steps`` steps (a collective); returns whether it did."""
        every = self.config.checkpoint.steps
        if not every or steps_done % every:
            return False
        self.save(trainer, steps_done=steps_done)
        return True

    def save(self, trainer: Checkpointable, *, steps_done: int | None = None) -> Path:
        """Write a checkpoint of ``trainer`` (a collective: replica 0 of each stage writes its shard, rank 0 the main
        file).

        Args:
            trainer: the run, at an epoch's end (after its transition) or after ``steps_done`` steps of its epoch.
            steps_done: steps of the current epoch already done, for a checkpoint inside an epoch.
        """
        ctx = trainer.ctx
        state = trainer.state_dict()
        epoch = trainer.state.epoch
        name = f"epoch-{epoch:04d}.pt" if steps_done is None else f"epoch-{epoch:04d}-step-{steps_done:06d}.pt"
        path = self.directory / name
        layout = trainer.state.layout
        plan = ctx.plan(layout)
        writers = plan.pipeline_groups[0]  # replica 0's ranks, stage by stage: replicas hold the same bits
        if ctx.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            remove_leftovers(self.directory)
        dist.barrier(group=ctx.groups.control_group)
        if ctx.rank in writers:
            s = writers.index(ctx.rank)
            shard = {"model": state["model"], "optimizer": {"state": state["optimizer"]["state"]}}
            if "probe" in state:  # a probe-driven policy's baseline: the outputs of the units ending on this stage
                shard["probe"] = state["probe"][str(s)]
            write_shard(self.directory, shard_name(name, s), shard)
        dist.barrier(group=ctx.groups.control_group)
        if ctx.rank == 0:
            files = [shard_name(name, s) for s in range(layout.pipe_len)]
            index = {
                k: files[s]
                for s, rank in enumerate(writers)
                for j in held_sublayers(layout, plan, rank)
                for k in ctx.sublayer_keys[j]
            }
            main = {k: v for k, v in state.items() if k not in ("model", "probe")}
            main["optimizer"] = {"param_groups": state["optimizer"]["param_groups"]}
            # each shard's SHA-256 (from its fresh manifest): a shard later swapped together with its manifest no
            # longer matches the main file, and the resume falls back
            main["shards"] = {"files": files, "index": index, "sha256": shard_digests(self.directory, files)}
            if "probe" in state:  # which shard keeps each stage's probe outputs
                main["probe"] = {str(s): files[s] for s in range(layout.pipe_len)}
            main["keys"] = [k for keys in ctx.sublayer_keys for k in keys]
            meta: Latest = {"epoch": epoch, "step": trainer.state.step, "fingerprint": fingerprint(ctx.model)}
            meta["config"] = trainer.given_config.to_dict()  # what a resume compares its config with (.rerun)
            write_checkpoint(self.directory, name, main, meta)
            prune(self.directory, self.config.checkpoint.keep_last, path)
        dist.barrier(group=ctx.groups.control_group)
        return path

    def _check(self, path: Path, ctx: RunContext) -> tuple[Found | None, str]:
        """This rank's checks of one checkpoint: the main file and its shards' SHA-256, the model fingerprint, and
        every tensor of this rank's share of the shards (shard ``i`` for ``i % world == rank``); returns the
        checkpoint, or ``None`` and what is wrong with it."""
        try:
            state, manifest = load_verified(path, allow_nonfinite=self.config.checkpoint.allow_nonfinite)
            check_compatible(manifest, ctx.model, str(path))
            verify_shards(state, ctx.rank, ctx.world_size)
        except ConfigError as exc:  # CorruptCheckpoint, or another model's fingerprint
            return None, str(exc)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a manifest of the wrong shape
            return None, f"{path}: cannot be checked ({type(exc).__name__}: {exc})"
        return Found(state, manifest, path), ""

    def find(self, trainer: Checkpointable) -> Found | None:
        """The newest checkpoint every rank found intact (a collective on the control group), before anything is
        loaded: each rank checks it (:meth:`_check`), the ranks agree, and one any rank refused is skipped on every
        rank, with a warning naming the file, the rank and the reason, for the next older one. A missing or corrupt
        ``latest.json`` falls back to scanning the directory (:func:`~.loads.candidates`), never to a
        fresh start.

        Returns:
            The checkpoint, or ``None`` when the directory holds none.

        Raises:
            ConfigError: checkpoints are there but none is intact (or all are another model's).
        """
        ctx = trainer.ctx
        paths = candidates(self.directory, warn=ctx.rank == 0)
        if paths is None:
            return None
        failures = []
        for path in paths:
            found, problem = self._check(path, ctx)
            refused = torch.zeros(ctx.world_size, dtype=torch.int32)
            refused[ctx.rank] = int(found is None)
            dist.all_reduce(refused, group=ctx.groups.control_group)
            if not bool(refused.any()):
                return found
            first = int(refused.nonzero()[0, 0])
            if ctx.rank == first:  # one warning per skipped file, by the first rank that refused it
                log.warning("skipping checkpoint %s (rank %d): %s", path, ctx.rank, problem)
            failures.append(problem or f"{path}: refused by rank {first}")
        raise ConfigError(
            f"no intact checkpoint in {self.directory}: " + " | ".join(failures) + " (resume = 'never' starts afresh)"
        )

    def resume(self, trainer: Checkpointable) -> bool:
        """Load the newest checkpoint every rank found intact (:meth:`find`) into ``trainer``; :attr:`loaded` names
        the file (every rank reads the main file and, of the shards, only the tensors it needs).

        Returns:
            Whether a checkpoint was loaded.

        Raises:
            ConfigError: checkpoints are there but none is intact (or all are another model's).
            OrchestratorError: its pipeline length does not fit this world size.
        """
        found = self.find(trainer)
        if found is None:
            return False
        trainer.load_state_dict(found.state)
        self.loaded = found.path
        return True
