"""Checkpoints: everything a run needs to continue, one shard per pipeline stage plus a main file, with manifests.

The :class:`Checkpointer` is built once with a map of named parts (:class:`~.parts.Stateful`: any object with
``state_dict()`` and ``load_state_dict(state)``) and saves each part's state under its name; it knows nothing of
what holds them (it never imports the trainer). The trainer's map (:meth:`TrainerBase.checkpoint_parts
<elastic_pipe.orchestrator.trainer_base.TrainerBase.checkpoint_parts>`) holds the run's position
(:class:`~elastic_pipe.orchestrator.state.RunState`: layout, budget, epoch, step), the RNG state, the weights and
the optimizer state (:mod:`.snapshot`), the inference record, the learning-rate scheduler, the freeze policy, the
sampler's position, the history, the epoch's losses so far and, for a probe-driven freeze policy, the probe
outputs kept for the next decision point (:mod:`~elastic_pipe.orchestrator.stage.probe`).

Three parts go to the stages' shards: the rank of replica 0 running stage ``s`` writes the shard of stage ``s``,
with the ``model`` part's weights of the stage's sub-layers (the frozen prefix too on stage 0), the ``optimizer``
part's ``state`` of their parameters (by name) and, in the shard of its first stage, its own entry of the ``probe``
part; a rank holding several stages (``[pipeline] virtual`` = v > 1, stage ``s`` on rank ``s % K``) writes one shard
for each, ``K * v`` in all, so a shard is one stage's whatever v is and one stage per rank writes what it wrote
before virtual stages. Rank 0 then writes the main file: every other part (the optimizer's ``param_groups`` too)
and the shard table (each shard's file and SHA-256, which shard holds each model key, and which keeps each rank's
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
fingerprint (names and shapes of its parameters) must be the model's, and the main file must hold every part (but
those given a default: an older checkpoint's missing part). Every check runs before anything is loaded into the
run: each rank checks the main file and a share of the shards (whole), and the ranks agree
(:meth:`Checkpointer.find`). A checkpoint any rank finds wrong is skipped on every rank with a warning naming it and
the reason, and the newest older one that passes is loaded instead; when none passes the run stops (it never
starts afresh over checkpoints; ``resume = 'never'`` does). A directory holding only another model's checkpoints is
refused before any process starts.

A run resumes into the same world size or a different one, and any layout: the layout's pipeline length must
divide the new world size; the replica count follows, the stages per rank follow the config (the saved layout
re-cut, :func:`.snapshot.position`), the sampler re-shards from its saved position, and each rank
reads from the shards (memory-mapped) only the weights it holds and the optimizer state of the parameters it owns
(and replica 0's ranks their stage's probe outputs, the probe's baseline: the next drift measured is the
uninterrupted run's; an older checkpoint without them takes the baseline from its weights). The parts are loaded
in the map's order, each from its entry: the position first, which the weights and the optimizer state are placed
by.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.persist.files import (
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
from elastic_pipe.orchestrator.persist.loads import candidates, check_compatible, fingerprint, load_verified
from elastic_pipe.orchestrator.persist.parts import Stateful, check_parts, entries
from elastic_pipe.orchestrator.persist.shards import verify_shards

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.state import RunState
    from elastic_pipe.types import Layout

__all__ = ["Checkpointer", "Found"]

log = logging.getLogger(__name__)


def _stage_sublayers(layout: Layout, stage: int) -> tuple[int, ...]:
    """The sub-layers whose weights stage ``stage``'s shard keeps: the stage's own, after the frozen prefix on stage
    0 (whose rank holds it)."""
    own = range(layout.boundaries[stage], layout.boundaries[stage + 1])
    return (*range(layout.frozen), *own) if stage == 0 else tuple(own)


@dataclass(frozen=True, slots=True)
class Found:
    """A checkpoint every rank found intact: its state (lazy views of its shards), its manifest and its file."""

    state: SavedState
    manifest: JsonObject
    path: Path


class Checkpointer:
    """Saves a run's parts every ``[checkpoint] every`` epochs (and every ``steps`` steps) and restores them by name.

    It only writes and reads files: each part's state comes from its ``state_dict`` and goes back through its
    ``load_state_dict``; it knows nothing of what holds the parts.

    Args:
        config: the run's configuration (``[checkpoint] dir`` must be set; ``every``, ``steps``, ``keep_last``,
            ``allow_nonfinite`` and ``[train] epochs`` are read).
        ctx: the rank's fixed facts: its rank and control group, the model (its fingerprint), each layout's plan
            and the sub-layers' keys (which shard holds which weight).
        parts: the parts by name, the name each keeps in the files, saved and loaded in this order (a part another
            one depends on first: the position before the weights it places). ``model``, ``optimizer`` (its
            ``state``) and ``probe`` go to the shards, the others to the main file.
        defaults: by part name, what a part loads when a checkpoint has no entry for it (one written before the
            part was kept); any other part missing makes a checkpoint refused.
        given: the config as given, which a checkpoint keeps for a resume to compare with (:mod:`.rerun`);
            default ``config``.

    Raises:
        ConfigError: no ``[checkpoint] dir``, a part named as one of the main file's own entries
            (:data:`~.parts.RESERVED`), or a default for a part the map does not have.
    """

    def __init__(
        self,
        config: TrainConfig,
        ctx: RunContext,
        parts: Mapping[str, Stateful],
        *,
        defaults: Mapping[str, object] | None = None,
        given: TrainConfig | None = None,
    ) -> None:
        if not config.checkpoint.dir:
            raise ConfigError("a Checkpointer needs [checkpoint] dir")
        defaults = dict(defaults or {})
        check_parts(parts, defaults)
        self.config = config
        self.ctx = ctx
        self.parts = dict(parts)
        self.defaults = defaults
        self.given = given if given is not None else config
        self.directory = Path(config.checkpoint.dir)

    def maybe_save(self, position: RunState) -> bool:
        """Save if the epoch just finished is due (a collective); returns whether a checkpoint was written."""
        epoch = position.epoch
        if epoch % self.config.checkpoint.every and epoch != self.config.train.epochs:
            return False
        self.save(position)
        return True

    def maybe_save_step(self, position: RunState, steps_done: int) -> bool:
        """Save inside an epoch every ``[checkpoint] steps`` steps (a collective); returns whether it did."""
        every = self.config.checkpoint.steps
        if not every or steps_done % every:
            return False
        self.save(position, steps_done=steps_done)
        return True

    def save(self, position: RunState, *, steps_done: int | None = None) -> Path:
        """Write a checkpoint of every part (a collective: each part's state is taken on every rank - a part's
        ``state_dict`` may be a collective, and may refuse - then replica 0's ranks write the shards of their stages,
        rank 0 the main file).

        Args:
            position: where the run stands (the file's name, the layout that says who writes which shard): at an
                epoch's end (after its transition) or after ``steps_done`` steps of its epoch.
            steps_done: steps of the current epoch already done, for a checkpoint inside an epoch.
        """
        ctx = self.ctx
        state: dict[str, Any] = {name: part.state_dict() for name, part in self.parts.items()}
        epoch = position.epoch
        name = f"epoch-{epoch:04d}.pt" if steps_done is None else f"epoch-{epoch:04d}-step-{steps_done:06d}.pt"
        path = self.directory / name
        layout = position.layout
        writers = ctx.plan(layout).pipeline_groups[0]  # replica 0's ranks, by position: replicas hold the same bits
        placement = layout.placement()
        stages = range(layout.num_stages)
        files = [shard_name(name, s) for s in stages]
        stage_keys = [[k for j in _stage_sublayers(layout, s) for k in ctx.sublayer_keys[j]] for s in stages]
        if ctx.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            remove_leftovers(self.directory)
        dist.barrier(group=ctx.groups.control_group)
        if ctx.rank in writers:
            p = writers.index(ctx.rank)
            for s in placement.stages_of(p):  # one shard per stage this rank holds
                mine = set(stage_keys[s])
                shard: dict[str, object] = {}
                if "model" in state:
                    shard["model"] = {k: t for k, t in state["model"].items() if k in mine}
                if "optimizer" in state:
                    shard["optimizer"] = {"state": {n: v for n, v in state["optimizer"]["state"].items() if n in mine}}
                if "probe" in state and s == p:  # the outputs of the units ending on this rank, in its first stage's
                    shard["probe"] = state["probe"][str(p)]
                write_shard(self.directory, files[s], shard)
        dist.barrier(group=ctx.groups.control_group)
        if ctx.rank == 0:
            index = {k: files[s] for s in stages for k in stage_keys[s]}
            main = {k: v for k, v in state.items() if k not in ("model", "probe")}
            if "optimizer" in state:
                main["optimizer"] = {"param_groups": state["optimizer"]["param_groups"]}
            # each shard's SHA-256 (from its fresh manifest): a shard later swapped together with its manifest no
            # longer matches the main file, and the resume falls back
            main["shards"] = {"files": files, "index": index, "sha256": shard_digests(self.directory, files)}
            if "probe" in state:  # which shard keeps each position's probe outputs: its first stage's
                main["probe"] = {str(p): files[p] for p in range(layout.pipe_len)}
            main["keys"] = [k for keys in ctx.sublayer_keys for k in keys]
            meta: Latest = {"epoch": epoch, "step": position.step, "fingerprint": fingerprint(ctx.model)}
            meta["config"] = self.given.to_dict()  # what a resume compares its config with (.rerun)
            write_checkpoint(self.directory, name, main, meta)
            prune(self.directory, self.config.checkpoint.keep_last, path)
        dist.barrier(group=ctx.groups.control_group)
        return path

    def _check(self, path: Path) -> tuple[Found | None, str]:
        """This rank's checks of one checkpoint: the main file and its shards' SHA-256, the model fingerprint, an
        entry for every part (or a default), and every tensor of this rank's share of the shards (shard ``i`` for
        ``i % world == rank``); returns the checkpoint, or ``None`` and what is wrong with it."""
        ctx = self.ctx
        try:
            state, manifest = load_verified(path, allow_nonfinite=self.config.checkpoint.allow_nonfinite)
            check_compatible(manifest, ctx.model, str(path))
            entries(self.parts, self.defaults, state, path)
            verify_shards(state, ctx.rank, ctx.world_size)
        except ConfigError as exc:  # CorruptCheckpoint, another model's fingerprint, a part missing
            return None, str(exc)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a manifest of the wrong shape
            return None, f"{path}: cannot be checked ({type(exc).__name__}: {exc})"
        return Found(state, manifest, path), ""

    def find(self) -> Found | None:
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
        ctx = self.ctx
        paths = candidates(self.directory, warn=ctx.rank == 0)
        if paths is None:
            return None
        failures = []
        for path in paths:
            found, problem = self._check(path)
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

    def load(self, found: Found) -> None:
        """Restore every part from a checkpoint :meth:`find` gave, by name, in the map's order (no collective: every
        rank reads the main file and, of the shards, only the tensors its parts ask for).

        Raises:
            ConfigError: the checkpoint holds no entry for a part without a default (:meth:`find` refused it).
            OrchestratorError: a part refuses its state (the position: a pipeline length this world size cannot
                run).
        """
        for name, saved in entries(self.parts, self.defaults, found.state, found.path).items():
            self.parts[name].load_state_dict(saved)
