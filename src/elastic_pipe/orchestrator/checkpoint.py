"""Checkpoints: everything a run needs to continue, in one file of tensors and plain data, with a manifest.

What is saved is :meth:`ElasticTrainer.state_dict` (rank 0 writes, after the optimizer state of every stage has
been sent to it): the model's weights, the optimizer's state by parameter name and its hyper-parameters, the
learning-rate scheduler, the freeze policy's state, the sampler's position, the RNG state, the run's position
(:class:`~elastic_pipe.orchestrator.state.RunState`: layout, budget, epoch, step) and the history so far.

Files in ``[checkpoint] dir``::

    epoch-0002.pt                   the state (torch.save)
    epoch-0002.manifest.json        its SHA-256, a CRC-32 per tensor, epoch, step, model fingerprint
    latest.json                     names the newest checkpoint (a plain file name inside the directory)

Every file is written to ``NAME.tmp``, flushed and fsynced, renamed over ``NAME``, and the directory is fsynced,
so a crash leaves either the old file or the new one; the checkpoint, then its manifest, then ``latest.json``.
A save first deletes ``.tmp`` files a crashed save left, and with ``keep_last = N`` deletes all but the newest N
checkpoints afterwards.

Loading uses ``torch.load(..., weights_only=True)``: tensors, numbers, strings, lists and dicts only; no object is
ever unpickled. Before that the file's SHA-256 must match its manifest; after it, every tensor's CRC-32 must, and
every floating-point value must be finite and within :data:`~elastic_pipe.orchestrator.integrity.MAX_ABS` (unless
``allow_nonfinite``). A checkpoint failing any check is skipped with a warning naming it, and the newest older one
that passes is loaded instead. ``latest.json`` fingerprints the model (names and shapes of its parameters), so a
checkpoint from another model is refused before any process starts.

A run resumes into the same world size or a different one: the layout's pipeline length must divide the new world
size; the replica count follows, the sampler re-shards from its saved position, and each rank keeps the optimizer
state of the parameters it owns.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn

from elastic_pipe.orchestrator.checkpoint_files import FORMAT, load_latest, prune, write_checkpoint
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError

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
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{source}: checkpoint format {meta.get('format')!r}, expected {FORMAT}")
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
        """Write a checkpoint of ``trainer`` (a collective: every rank sends its stage's state to rank 0).

        Args:
            trainer: the run, at an epoch's end (after its transition) or after ``steps_done`` steps of its epoch.
            steps_done: steps of the current epoch already done, for a checkpoint inside an epoch.
        """
        state = trainer.state_dict()
        epoch = trainer.state.epoch
        name = f"epoch-{epoch:04d}.pt" if steps_done is None else f"epoch-{epoch:04d}-step-{steps_done:06d}.pt"
        path = self.directory / name
        if trainer.ctx.rank == 0:
            meta = {"epoch": epoch, "step": trainer.state.step, "fingerprint": fingerprint(trainer.ctx.model)}
            write_checkpoint(self.directory, name, state, meta)
            prune(self.directory, self.config.checkpoint.keep_last, path)
        dist.barrier(group=trainer.ctx.groups.control_group)
        return path

    def resume(self, trainer: ElasticTrainer) -> bool:
        """Load the newest checkpoint into ``trainer`` if there is one (every rank reads the file).

        Returns:
            Whether a checkpoint was loaded.

        Raises:
            ConfigError: the checkpoint is from another model, or no checkpoint in the directory is intact.
            OrchestratorError: its pipeline length does not fit this world size.
        """
        found = load_latest(
            self.directory, allow_nonfinite=self.config.checkpoint.allow_nonfinite, warn=trainer.ctx.rank == 0
        )
        if found is None:
            return False
        state, manifest = found
        check_compatible(manifest, trainer.parts.model, str(self.directory))
        trainer.load_state_dict(state)
        return True
