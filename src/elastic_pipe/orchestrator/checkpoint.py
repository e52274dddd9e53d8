"""Checkpoints: everything a run needs to continue, one shard per pipeline stage plus a main file, with manifests.

What is saved is :meth:`ElasticTrainer.state_dict`, each rank's share: the rank running stage ``s`` of replica 0
writes the shard of stage ``s`` (the weights of the sub-layers it holds - the frozen prefix too on stage 0 - the
optimizer state of the parameters it owns, by name, and, for a probe-driven freeze policy, the probe outputs it
keeps for the next decision point: :mod:`.probe`); rank 0 then writes the main file: the optimizer's
hyper-parameters, the learning-rate scheduler, the freeze policy's state, the sampler's position, the RNG state, the
run's position (:class:`~elastic_pipe.orchestrator.state.RunState`: layout, budget, epoch, step), the history so
far and the shard table (each shard's file and SHA-256, and which shard keeps each stage's probe outputs). No rank
receives another stage's weights or optimizer state.

Files in ``[checkpoint] dir`` (shared by every rank that writes a shard)::

    epoch-0002.stage-0000.pt              stage 0's shard (torch.save), and its manifest:
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
tensor's CRC-32 must, and every floating-point value must be finite and within
:data:`~elastic_pipe.orchestrator.integrity.MAX_ABS` (unless ``allow_nonfinite``). A checkpoint failing any check
is skipped with a warning naming it, and the newest older one that passes is loaded instead. ``latest.json``
fingerprints the model (names and shapes of its parameters), so a checkpoint from another model is refused before
any process starts.

A run resumes into the same world size or a different one, and any layout: the layout's pipeline length must
divide the new world size; the replica count follows, the sampler re-shards from its saved position, and each rank
reads from the shards (memory-mapped) only the weights it holds and the optimizer state of the parameters it owns
(and replica 0's ranks their stage's probe outputs, which stand in for the probe's new baseline: the next drift
measured is the uninterrupted run's, from any step checkpoint; a checkpoint without them - written before they were
kept - takes the baseline from its weights).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn

from elastic_pipe.orchestrator.checkpoint_files import (
    FORMATS,
    find_latest,
    prune,
    remove_leftovers,
    shard_digests,
    shard_name,
    write_checkpoint,
    write_shard,
)
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.transition import held_sublayers

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.trainer import ElasticTrainer

__all__ = ["Checkpointer", "check_compatible", "fingerprint"]

log = logging.getLogger(__name__)


def fingerprint(model: nn.Module) -> dict[str, list[Any]]:
    """Names and shapes of the model's parameters and buffers (what must match for a checkpoint to fit)."""
    state = model.state_dict()
    return {"names": list(state), "shapes": [list(t.shape) for t in state.values()]}


def check_compatible(meta: dict[str, Any], model: nn.Module, source: str) -> None:
    """Refuse a checkpoint made for another model.

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


class Checkpointer:
    """Saves an :class:`ElasticTrainer` every ``[checkpoint] every`` epochs and resumes it.

    It only writes and reads files: the state comes from :meth:`ElasticTrainer.state_dict` and goes back through
    :meth:`ElasticTrainer.load_state_dict`.

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

    def maybe_save(self, trainer: ElasticTrainer) -> bool:
        """Save if the epoch just finished is due (a collective); returns whether a checkpoint was written."""
        epoch = trainer.state.epoch
        if epoch % self.config.checkpoint.every and epoch != self.config.train.epochs:
            return False
        self.save(trainer)
        return True

    def maybe_save_step(self, trainer: ElasticTrainer, steps_done: int) -> bool:
        """Save inside an epoch every ``[checkpoint] steps`` steps (a collective); returns whether it did."""
        every = self.config.checkpoint.steps
        if not every or steps_done % every:
            return False
        self.save(trainer, steps_done=steps_done)
        return True

    def save(self, trainer: ElasticTrainer, *, steps_done: int | None = None) -> Path:
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
            meta = {"epoch": epoch, "step": trainer.state.step, "fingerprint": fingerprint(ctx.model)}
            meta["config"] = trainer.given_config.to_dict()  # what a resume compares its config with (rerun.py)
            write_checkpoint(self.directory, name, main, meta)
            prune(self.directory, self.config.checkpoint.keep_last, path)
        dist.barrier(group=ctx.groups.control_group)
        return path

    def resume(self, trainer: ElasticTrainer) -> bool:
        """Load the newest intact checkpoint into ``trainer`` if there is one (every rank reads the main file and, of
        the shards, only the tensors it needs); :attr:`loaded` names the file. A missing or corrupt ``latest.json``
        falls back to scanning the directory (:func:`~.checkpoint_files.find_latest`), never to a fresh start.

        Returns:
            Whether a checkpoint was loaded.

        Raises:
            ConfigError: the checkpoint is from another model, or no checkpoint in the directory is intact.
            OrchestratorError: its pipeline length does not fit this world size.
        """
        found = find_latest(
            self.directory, allow_nonfinite=self.config.checkpoint.allow_nonfinite, warn=trainer.ctx.rank == 0
        )
        if found is None:
            return False
        state, manifest, path = found
        check_compatible(manifest, trainer.parts.model, str(path))
        trainer.load_state_dict(state)
        self.loaded = path
        return True
