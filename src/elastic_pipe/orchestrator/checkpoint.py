"""Checkpoints: everything a run needs to continue, in one file of tensors and plain data.

What is saved (rank 0 writes, after the optimizer state of every stage has been broadcast to it): the model's
weights, the optimizer's state by parameter name and its hyper-parameters, the learning-rate scheduler, the freeze
policy's state, the sampler's position, the RNG state, the current layout and budget, and the history so far.

Loading uses ``torch.load(..., weights_only=True)``: tensors, numbers, strings, lists and dicts only; no object is
ever unpickled. A JSON side file (``latest.json``) names the newest checkpoint and fingerprints the model (names
and shapes of its parameters), so a checkpoint from another model is refused before any process starts.

A run resumes into the same world size or a different one: the layout's pipeline length must divide the new world
size; the replica count follows, the sampler re-shards from its saved position, and each rank keeps the optimizer
state of the parameters it owns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import freeze
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError, OrchestratorError
from elastic_pipe.orchestrator.transition import drop_foreign_state, owned_sublayers
from elastic_pipe.types import Layout

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.runtime import ElasticRun

__all__ = ["FORMAT", "LATEST", "Checkpointer", "check_compatible", "fingerprint", "read_latest"]

#: Version of the checkpoint layout; bumped on any incompatible change.
FORMAT = 1
#: Name of the side file that points at the newest checkpoint.
LATEST = "latest.json"


def fingerprint(model: nn.Module) -> dict[str, list[Any]]:
    """Names and shapes of the model's parameters and buffers (what must match for a checkpoint to fit)."""
    state = model.state_dict()
    return {"names": list(state), "shapes": [list(t.shape) for t in state.values()]}


def read_latest(directory: str | Path) -> dict[str, Any] | None:
    """The side file of the newest checkpoint in ``directory``, or ``None`` when there is none."""
    path = Path(directory) / LATEST
    if not path.exists():
        return None
    try:
        meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read checkpoint index {path}: {exc}") from exc
    return meta


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


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


class Checkpointer:
    """Saves a :class:`ElasticRun` every ``config.checkpoint_every`` epochs and resumes it.

    Args:
        config: the run's configuration (``checkpoint_dir`` must be set).
    """

    def __init__(self, config: TrainConfig) -> None:
        if not config.checkpoint_dir:
            raise ConfigError("a Checkpointer needs config.checkpoint_dir")
        self.config = config
        self.directory = Path(config.checkpoint_dir)

    def maybe_save(self, run: ElasticRun) -> bool:
        """Save if the epoch just finished is due (a collective); returns whether a checkpoint was written."""
        if run.epoch % self.config.checkpoint_every and run.epoch != self.config.epochs:
            return False
        self.save(run)
        return True

    def maybe_save_step(self, run: ElasticRun, steps_done: int) -> bool:
        """Save inside an epoch every ``config.checkpoint_steps`` steps (a collective); returns whether it did."""
        every = self.config.checkpoint_steps
        if not every or steps_done % every:
            return False
        self.save(run, steps_done=steps_done)
        return True

    def save(self, run: ElasticRun, *, steps_done: int | None = None) -> Path:
        """Write a checkpoint of ``run`` (a collective: every rank sends its stage's state to rank 0).

        Args:
            run: the run, at an epoch's end (after its transition) or after ``steps_done`` steps of ``run.epoch``.
            steps_done: steps of the current epoch already done, for a checkpoint inside an epoch.
        """
        run.sync_weights(with_optimizer=True, keep_all_on=0)
        epoch_losses = run.losses_so_far() if steps_done is not None else []
        name = f"epoch-{run.epoch:04d}.pt" if steps_done is None else f"epoch-{run.epoch:04d}-step-{steps_done:06d}.pt"
        path = self.directory / name
        if run.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            state = self._state(run)
            state["epoch_losses"] = epoch_losses
            torch.save(state, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)
            meta = {
                "format": FORMAT,
                "file": path.name,
                "epoch": run.epoch,
                "step": run.step,
                "fingerprint": fingerprint(run.model),
            }
            tmp = self.directory / (LATEST + ".tmp")
            tmp.write_text(json.dumps(meta), encoding="utf-8")
            os.replace(tmp, self.directory / LATEST)
            drop_foreign_state(run.optimizer, run.sublayers, owned_sublayers(run.layout, run.plan, run.rank))  # type: ignore[arg-type]
        dist.barrier(group=run.groups.control_group)
        return path

    def _state(self, run: ElasticRun) -> dict[str, Any]:
        layout = run.layout
        assert layout is not None
        names = _param_names(run.model)
        opt_state = {
            names[id(p)]: {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
            for p, s in run.optimizer.state.items()
        }
        groups = [{k: v for k, v in g.items() if k != "params"} for g in run.optimizer.param_groups]
        return {
            "format": FORMAT,
            "epoch": run.epoch,
            "step": run.step,
            "frozen_units": run.frozen_units,
            "budget": run.budget,
            "layout": {
                "frozen": layout.frozen,
                "pipe_len": layout.pipe_len,
                "boundaries": list(layout.boundaries),
                "microbatches": layout.microbatches,
            },
            "model": {k: v.detach().cpu() for k, v in run.model.state_dict().items()},
            "optimizer": {"state": opt_state, "param_groups": groups},
            "scheduler": run.scheduler.state_dict(),
            "policy": run.policy.state_dict(),
            "sampler": run.sampler.state_dict(),
            "rng": torch.get_rng_state(),
            "history": {
                "epochs": run.result.epochs,
                "transitions": run.result.transitions,
                "losses": run.result.losses,
            },
        }

    def resume(self, run: ElasticRun) -> bool:
        """Load the newest checkpoint into ``run`` if there is one (every rank reads the file).

        Returns:
            Whether a checkpoint was loaded.

        Raises:
            ConfigError: the checkpoint is from another model.
            OrchestratorError: its pipeline length does not fit this world size.
        """
        meta = read_latest(self.directory)
        if meta is None:
            return False
        check_compatible(meta, run.model, str(self.directory))
        state = torch.load(self.directory / meta["file"], map_location="cpu", weights_only=True)
        lay = state["layout"]
        pipe_len = int(lay["pipe_len"])
        if run.world_size % pipe_len or pipe_len not in run.groups.pipe_lens:
            raise OrchestratorError(
                f"the checkpoint's pipeline length {pipe_len} cannot run on {run.world_size} processes "
                f"(possible lengths: {list(run.groups.pipe_lens)})"
            )
        run.model.load_state_dict(state["model"])
        layout = Layout(
            int(lay["frozen"]), pipe_len, run.world_size // pipe_len, tuple(lay["boundaries"]), lay["microbatches"]
        )
        if layout.frozen:
            freeze.freeze_modules(run.sublayers[: layout.frozen], run.optimizer)
        run.layout = layout
        owned = owned_sublayers(layout, run.plan, run.rank)
        by_name = dict(run.model.named_parameters())
        # A fused optimizer keeps its step count beside the parameters; the others keep it on the host.
        fused = bool(run.optimizer.defaults.get("fused"))
        for name, s in state["optimizer"]["state"].items():
            p = by_name[name]
            j = next(i for i, m in enumerate(run.sublayers) if any(q is p for q in m.parameters()))
            if j in owned:
                run.optimizer.state[p] = {
                    k: (v.to(run.device) if isinstance(v, torch.Tensor) and (fused or k != "step") else v)
                    for k, v in s.items()
                }
        for group, saved in zip(run.optimizer.param_groups, state["optimizer"]["param_groups"], strict=False):
            # hyper-parameters come back; how the update runs (fused or not) is this machine's choice
            group.update({k: v for k, v in saved.items() if k not in ("fused", "foreach")})
        run.scheduler.load_state_dict(state["scheduler"])
        run.policy.load_state_dict(state["policy"])
        run.sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["rng"])
        run.epoch = int(state["epoch"])
        run.step = int(state["step"])
        run.frozen_units = int(state["frozen_units"])
        run.budget = float(state["budget"])
        history = state["history"]
        run.result.epochs = list(history["epochs"])
        run.result.transitions = list(history["transitions"])
        run.result.losses = list(history["losses"])
        run.partial_losses = [float(v) for v in state.get("epoch_losses", [])]
        run.restore_after_load()
        return True
