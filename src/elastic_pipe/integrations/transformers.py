"""The freeze policies as a Hugging Face ``Trainer`` callback (needs ``pip install elastic-pipe[transformers]``).

Usage::

    from elastic_pipe.integrations.transformers import FreezeCallback

    trainer = Trainer(model, args, train_dataset=..., callbacks=[FreezeCallback()])   # drift, the default policy
    trainer.train()                                   # or trainer.train(resume_from_checkpoint=True): exact resume

What happens where (every rank does the same; rank 0's decisions are broadcast):

* ``on_train_begin``: the model's blocks are located (:func:`~.blocks.find_blocks`), the policy is built over them
  with ``total_steps`` = the run's optimizer steps, the decision interval fixed (drift: 4 decisions per epoch), the
  probe batch taken (the first 16 training samples), and a resumed run's freeze state read from the checkpoint;
* ``on_pre_optimizer_step``: gradient statistics, for a policy that reads them;
* ``on_step_end``: at a decision point the policy decides; newly frozen blocks leave the optimizer (the others keep
  their state), and under DDP the wrapper is re-wrapped over what still trains (:func:`~.ddp.rewrap_ddp`): no
  frozen parameter is all-reduced, and no step needs ``find_unused_parameters``;
* ``on_evaluate``: the held-out loss (``eval_loss``) goes to the policy's guard;
* ``on_log``: ``frozen_blocks`` joins the logged values (callbacks after this one, e.g. the progress bar, see it;
  every freeze is also an entry of ``state.log_history``, saved in ``trainer_state.json``);
* ``on_save``: the callback's state is written beside the checkpoint (:data:`STATE_FILE`, and the probe's baseline
  outputs in :data:`PROBE_FILE`), read back by a resumed run.

With ``cache=True`` (and the sample index in every batch, ``index_key``), a forward pre-hook on the model takes the
index out of each training forward's arguments and serves the frozen prefix from the cache
(:mod:`~.prefix_cache`): the frozen blocks run once per sample.

The Trainer rebuilds its optimizer from every trainable parameter before callbacks run on a resume, so the callback
makes the optimizer's saved state list every parameter it held when training began, the frozen ones without state
(:func:`~.controller.expand_optimizer_state`): the checkpoint loads, and the restored freeze drops them again.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from elastic_pipe import freeze
from elastic_pipe.integrations.blocks import BlockFn
from elastic_pipe.integrations.controller import PROBE_SAMPLES, FreezeController, PolicySpec
from elastic_pipe.integrations.ddp import rewrap_ddp
from elastic_pipe.integrations.errors import IntegrationError
from elastic_pipe.integrations.prefix_cache import CacheSettings, PrefixCache
from elastic_pipe.integrations.probe import (
    LABEL_KEYS,
    ProbeForward,
    checked_probe_samples,
    default_forward,
    device_of,
    first_samples,
    to_device,
)

__all__ = ["PROBE_FILE", "STATE_FILE", "FreezeCallback"]

#: The callback's state in a checkpoint directory (JSON: policy snapshot, frozen count, decisions).
STATE_FILE = "elastic_pipe_freeze.json"
#: The probe's baseline outputs in a checkpoint directory (``torch.save`` of ``{block: tensor}``).
PROBE_FILE = "elastic_pipe_freeze_probe.pt"
#: The key of the frozen count in the logged values.
LOG_KEY = "frozen_blocks"

_log = logging.getLogger(__name__)


class FreezeCallback(TrainerCallback):
    """Freeze the model's leading blocks under a freeze policy while the ``Trainer`` trains.

    Args:
        policy: a :class:`~elastic_pipe.freeze.FreezePolicy` over as many units as the model has blocks, a
            registry name, a factory ``(num_units, total_steps) -> policy``, or None for the default (``drift``).
        blocks: a function listing the model's blocks, for a model the adapters do not know.
        decide_every: optimizer steps between decision points; default: the policy's rhythm.
        policy_options: keyword options for a policy given by name.
        probe: the probe batch of a probe-driven policy; default: the first ``probe_samples`` training samples.
        probe_samples: samples in the default probe batch.
        probe_forward: ``(model, batch) -> anything``, runs the model on the probe batch; default: ``model(**batch)``
            without the labels.
        resume_from: where a resumed run's freeze state is; default: ``<output_dir>/checkpoint-<step>``, the
            checkpoint ``resume_from_checkpoint=True`` picks.
        find_unused_parameters: the DDP wrapper's setting, applied at its first forward and at every freeze's
            re-wrap (False: no step pays for it, whatever ``ddp_find_unused_parameters`` says; None: keep the
            Trainer's, and re-wrap only at freezes).
        cache, index_key, augmentation, cache_views, cache_budget: the frozen-prefix cache and its options
            (:class:`~.prefix_cache.CacheSettings`; docs/integrations.md, "The frozen-prefix cache").

    Raises:
        IntegrationError: a bad option, including ``cache=True`` with random augmentation and no ``cache_views``.
    """

    def __init__(
        self,
        policy: PolicySpec = None,
        *,
        blocks: BlockFn | None = None,
        decide_every: int | None = None,
        policy_options: dict[str, Any] | None = None,
        probe: Any = None,
        probe_samples: int = PROBE_SAMPLES,
        probe_forward: ProbeForward | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        find_unused_parameters: bool | None = False,
        cache: bool = False,
        index_key: str = "idx",
        augmentation: str = "none",
        cache_views: int | None = None,
        cache_budget: int | str | None = None,
    ) -> None:
        probe_samples = checked_probe_samples(probe_samples)  # before anything is built
        settings = CacheSettings(index_key, augmentation, cache_views, cache_budget)
        self.cache = PrefixCache(settings) if cache else None
        self._cache_hook: Any = None
        self.controller = FreezeController(
            policy, blocks=blocks, decide_every=decide_every, policy_options=policy_options
        )
        self._probe = probe
        self._probe_samples = probe_samples
        self._probe_forward = probe_forward or default_forward
        self._resume_from = None if resume_from is None else Path(resume_from)
        self._find_unused = find_unused_parameters
        self._ddp: DistributedDataParallel | None = None
        self._rewrap_pending = False
        self._finder: Any = None
        self._model: nn.Module | None = None

    @property
    def frozen(self) -> int:
        """Leading blocks frozen now."""
        return self.controller.frozen

    # -- events --------------------------------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model: nn.Module = kwargs["model"]
        loader = kwargs.get("train_dataloader")
        c = self.controller
        c.locate(model)
        self._model = model
        total = int(state.max_steps)
        accumulation = max(1, int(args.gradient_accumulation_steps))
        per_epoch = math.ceil(len(loader) / accumulation) if loader is not None and hasattr(loader, "__len__") else 0
        if per_epoch < 1:  # an iterable loader: the run's steps stand for one epoch
            per_epoch = total
        c.build_policy(total)
        c.set_rhythm(per_epoch, total)
        c.attach_optimizer(kwargs["optimizer"], save_full_layout=True)
        if self.cache is not None:
            self._attach_cache(model, loader)
        if self._probe is not None or (c.policy is not None and _needs_probe(c)):
            batch = self._probe if self._probe is not None else first_samples(loader, self._probe_samples)
            if self.cache is not None:
                batch = self.cache.without_index(batch)
            batch = to_device(batch, device_of(model))
            c.set_probe(lambda: self._probe_forward(model, batch))
        resumed = state.global_step > 0
        if resumed:
            c.load_state_dict(self._read_state(args, state))
        # the Trainer's own default for a PreTrainedModel is find_unused_parameters=True: re-wrapped at its first
        # forward, no step pays for it (find_unused_parameters=None keeps the Trainer's setting)
        self._rewrap_pending = _distributed() and self._find_unused is not None
        self._watch_for_ddp(model)
        if c.start(resumed=resumed) is not None:
            self._after_freeze(state, resumed=resumed)

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.cache is not None:
            self.cache.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.controller.after_backward()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.controller.step_end(state.global_step) is not None:
            self._after_freeze(state, resumed=False)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        metrics = kwargs.get("metrics") or {}
        loss = metrics.get("eval_loss")
        if isinstance(loss, int | float) and math.isfinite(loss):
            self.controller.observe_eval(float(loss))

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        logs = kwargs.get("logs")
        if isinstance(logs, dict) and self.controller.policy is not None:
            logs[LOG_KEY] = self.controller.frozen

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.controller.policy is None:
            return
        folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        snapshot = self.controller.state_dict()
        probe = snapshot.pop("probe", None)
        (folder / STATE_FILE).write_text(json.dumps(snapshot, indent=1) + "\n", encoding="utf-8")
        if probe is not None:
            torch.save(probe, folder / PROBE_FILE)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._stop_watching()
        if self._cache_hook is not None:
            self._cache_hook.remove()
            self._cache_hook = None
        if self.cache is not None:
            self.cache.close()

    # -- helpers -------------------------------------------------------------------------------------------------

    def _read_state(self, args: TrainingArguments, state: TrainerState) -> dict[str, Any]:
        folder = self._resume_from or Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        path = folder / STATE_FILE
        if not path.is_file():
            raise IntegrationError(
                f"FreezeCallback: resuming at step {state.global_step}, but {path} does not exist; expected the "
                "checkpoint written with this callback (pass resume_from=<checkpoint dir> if it is elsewhere)"
            )
        snapshot: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        probe_path = folder / PROBE_FILE
        if probe_path.is_file():
            snapshot["probe"] = torch.load(probe_path, map_location="cpu", weights_only=True)
        return snapshot

    def _after_freeze(self, state: TrainerState, *, resumed: bool) -> None:
        c = self.controller
        if not resumed and c.events:
            event = c.events[-1]
            state.log_history.append(
                {f"freeze/{LOG_KEY}": event["frozen"], "freeze/previous": event["previous"], "step": event["step"]}
            )
            _log.info("step %d: %d of %d blocks frozen", event["step"], event["frozen"], len(c.blocks or ()))
        if self.cache is not None:
            self.cache.set_boundary(c.frozen)
        if self._ddp is not None:
            rewrap_ddp(self._ddp, find_unused_parameters=self._find_unused)
        elif _distributed():
            self._rewrap_pending = True  # the wrapper is found at its first forward, before it runs

    def _attach_cache(self, model: nn.Module, loader: Any) -> None:
        """Check the batches carry the index, then serve every training forward of ``model`` from the cache."""
        cache, blocks = self.cache, self.controller.blocks
        assert cache is not None and blocks is not None
        cache.attach(model, blocks, getattr(loader, "dataset", None))
        cache.check_batch(first_samples(loader, 1))
        key = cache.settings.index_key

        def serve(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            cache.release()
            if key not in kwargs:
                return args, kwargs
            kwargs = dict(kwargs)
            index = kwargs.pop(key)
            if not module.training or cache.boundary == 0:  # nothing to serve: no copy of the index to the host
                return args, kwargs
            ids = cache.ids_of({key: index})
            if ids is not None:
                inputs = {k: v for k, v in kwargs.items() if k not in LABEL_KEYS}
                cache.prepare(ids, lambda: module(*args, **inputs))
            return args, kwargs

        if self._cache_hook is None:
            self._cache_hook = model.register_forward_pre_hook(serve, with_kwargs=True)

    def _watch_for_ddp(self, model: nn.Module) -> None:
        """Find the Trainer's DDP wrapper of ``model`` at its first call (a callback is never handed the wrapper):
        a global forward pre-hook, removed once it has seen it, which runs before the wrapper's forward."""
        if self._ddp is not None or self._finder is not None or not _distributed():
            return

        def find(module: nn.Module, _args: object) -> None:
            if isinstance(module, DistributedDataParallel) and module.module is model:
                self._ddp = module
                self._stop_watching()
                if self._rewrap_pending:
                    self._rewrap_pending = False
                    rewrap_ddp(module, find_unused_parameters=self._find_unused)

        self._finder = torch.nn.modules.module.register_module_forward_pre_hook(find)

    def _stop_watching(self) -> None:
        if self._finder is not None:
            self._finder.remove()
            self._finder = None


def _needs_probe(controller: FreezeController) -> bool:
    return controller.policy is not None and freeze.needs_probe(controller.policy)


def _distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )
