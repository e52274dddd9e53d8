"""The freeze policies as a PyTorch Lightning callback (needs ``pip install elastic-pipe[lightning]``).

Usage::

    from elastic_pipe.integrations.lightning import FreezeCallback

    trainer = lightning.Trainer(max_epochs=4, callbacks=[FreezeCallback()])     # drift, the default policy
    trainer.fit(module, train_loader, val_loader)          # resume: trainer.fit(..., ckpt_path=...): exact

What happens where (every rank does the same; rank 0's decisions are broadcast):

* ``load_state_dict`` (a resume, before the optimizers exist): the saved state is kept;
* ``on_fit_start`` (optimizers built, model wrapped, optimizer state not yet restored): the blocks are located
  (:func:`~.blocks.find_blocks`, inside the LightningModule too), a resumed freeze is applied - so the restored
  optimizer state fits - and under DDP the wrapper re-wrapped;
* ``on_train_start``: the policy is built with ``total_steps`` = ``trainer.estimated_stepping_batches``, the decision
  interval fixed (drift: 4 decisions per epoch), the probe batch taken (the first 16 training samples);
* ``on_before_optimizer_step``: gradient statistics, for a policy that reads them;
* ``on_train_batch_end`` after an optimizer step: at a decision point the policy decides; newly frozen blocks leave
  the optimizer (the others keep their state) and under DDP ``trainer.strategy.model`` is re-wrapped over what still
  trains (:func:`~.ddp.rewrap_ddp`); ``frozen_blocks`` is logged with ``pl_module.log``;
* ``on_validation_end``: the monitored held-out loss (``monitor``, default ``"val_loss"``) goes to the policy's guard;
* ``state_dict``: the policy's snapshot, the frozen count, the decisions and the probe's baseline, saved in the
  trainer's own checkpoints.

With ``cache=True`` (and the sample index in every batch, ``index_key``: a mapping's key or a tuple's position),
``on_train_batch_start`` fills the batch's misses with ``probe_forward`` (default: the module's forward) on their
rows and serves the frozen prefix from the cache (:mod:`~.prefix_cache`) until ``on_train_batch_end``: the frozen
blocks run once per sample. ``training_step`` receives the batch with its index and leaves it out of the model call.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from torch.nn.parallel import DistributedDataParallel

from elastic_pipe import freeze
from elastic_pipe.integrations.blocks import BlockFn
from elastic_pipe.integrations.controller import PROBE_SAMPLES, FreezeController, PolicySpec
from elastic_pipe.integrations.ddp import rewrap_ddp
from elastic_pipe.integrations.errors import IntegrationError
from elastic_pipe.integrations.prefix_cache import CacheSettings, PrefixCache
from elastic_pipe.integrations.probe import (
    ProbeForward,
    checked_probe_samples,
    default_forward,
    device_of,
    first_samples,
    to_device,
)

__all__ = ["FreezeCallback"]

#: The name of the logged frozen count.
LOG_KEY = "frozen_blocks"


class FreezeCallback(pl.Callback):
    """Freeze the LightningModule's leading blocks under a freeze policy while Lightning trains.

    Args:
        policy: a :class:`~elastic_pipe.freeze.FreezePolicy` over as many units as the model has blocks, a
            registry name, a factory ``(num_units, total_steps) -> policy``, or None for the default (``drift``).
        blocks: a function listing the blocks (given the LightningModule), for a model the adapters do not know.
        decide_every: optimizer steps between decision points; default: the policy's rhythm.
        policy_options: keyword options for a policy given by name.
        probe: the probe batch of a probe-driven policy; default: the first ``probe_samples`` training samples.
        probe_samples: samples in the default probe batch.
        probe_forward: ``(pl_module, batch) -> anything``, runs the module on the probe batch; default: a mapping
            as keywords (labels left out), a tuple's first element, a tensor as it is.
        monitor: the logged metric handed to the policy's held-out guard after each validation.
        find_unused_parameters: the DDP wrapper's setting from the first step on and after every freeze's re-wrap
            (False: no step pays for it; None: keep the strategy's).
        cache, index_key, augmentation, cache_views, cache_budget: the frozen-prefix cache and its options
            (:class:`~.prefix_cache.CacheSettings`; docs/integrations.md, "The frozen-prefix cache").

    Raises:
        IntegrationError: a bad option (``cache=True`` with random augmentation and no ``cache_views`` too).
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
        monitor: str = "val_loss",
        find_unused_parameters: bool | None = False,
        cache: bool = False,
        index_key: str | int = "idx",
        augmentation: str = "none",
        cache_views: int | None = None,
        cache_budget: int | str | None = None,
    ) -> None:
        probe_samples = checked_probe_samples(probe_samples)  # before anything is built
        settings = CacheSettings(index_key, augmentation, cache_views, cache_budget)
        self.cache = PrefixCache(settings) if cache else None
        self.controller = FreezeController(
            policy, blocks=blocks, decide_every=decide_every, policy_options=policy_options
        )
        self._probe = probe
        self._probe_samples = probe_samples
        self._probe_forward = probe_forward or default_forward
        self._monitor = monitor
        self._find_unused = find_unused_parameters
        self._last_step = -1

    @property
    def frozen(self) -> int:
        """Leading blocks frozen now."""
        return self.controller.frozen

    # -- checkpoint ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict() if self.controller.policy is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self.controller.load_state_dict(state_dict)

    # -- events --------------------------------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        c = self.controller
        c.locate(pl_module)
        if not trainer.optimizers:
            raise IntegrationError("FreezeCallback: the LightningModule configured no optimizer; expected one")
        c.attach_optimizer(trainer.optimizers[0])
        before = c.frozen
        c.apply_pending_freeze()  # before Lightning restores the optimizer state, which holds only what trains
        model = trainer.strategy.model
        unused = isinstance(model, DistributedDataParallel) and self._find_unused not in (
            None,
            model.find_unused_parameters,
        )
        if c.frozen > before or unused:
            self._rewrap(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        c = self.controller
        total = trainer.estimated_stepping_batches
        total = int(total) if math.isfinite(total) else int(trainer.max_steps)
        batches = trainer.num_training_batches
        accumulation = max(1, int(trainer.accumulate_grad_batches))
        per_epoch = math.ceil(batches / accumulation) if math.isfinite(batches) and batches > 0 else total
        c.build_policy(total)
        c.set_rhythm(per_epoch, total)
        loader = trainer.train_dataloader
        if self.cache is not None:
            assert c.blocks is not None
            self.cache.attach(pl_module, c.blocks, getattr(loader, "dataset", None))
            self.cache.check_batch(first_samples(loader, 1))
        if self._probe is not None or freeze.needs_probe(c.policy):  # type: ignore[arg-type]
            batch = self._probe if self._probe is not None else first_samples(loader, self._probe_samples)
            if self.cache is not None:
                batch = self.cache.without_index(batch)
            batch = to_device(batch, device_of(pl_module))
            c.set_probe(lambda: self._probe_forward(pl_module, batch))
        resumed = trainer.global_step > 0
        self._last_step = trainer.global_step
        if c.start(resumed=resumed) is not None:
            self._rewrap(trainer)
        if self.cache is not None:
            self.cache.set_boundary(c.frozen)  # a restored freeze's, or the decision before step 0's

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.cache is not None:
            self.cache.set_epoch(trainer.current_epoch)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        cache = self.cache
        if cache is None or not pl_module.training or cache.boundary == 0:  # nothing frozen: nothing to serve
            return
        ids = cache.ids_of(batch)
        if ids is None:
            cache.check_batch(batch)  # raises, naming the key
            return
        inputs = cache.without_index(batch)
        cache.prepare(ids, lambda: self._probe_forward(pl_module, inputs))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self.controller.after_backward()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.cache is not None:
            self.cache.release()
        step = trainer.global_step
        if step == self._last_step:  # an accumulation micro-batch: no optimizer step yet
            return
        self._last_step = step
        decided = self.controller.is_decision_point(step)
        if self.controller.step_end(step) is not None:
            self._rewrap(trainer)
            if self.cache is not None:
                self.cache.set_boundary(self.controller.frozen)
        if decided:
            pl_module.log(LOG_KEY, float(self.controller.frozen), on_step=True, on_epoch=False, sync_dist=False)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self._monitor)
        if value is not None:
            loss = float(value)
            if math.isfinite(loss):
                self.controller.observe_eval(loss)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.cache is not None:
            self.cache.close()

    # -- helpers -------------------------------------------------------------------------------------------------

    def _rewrap(self, trainer: pl.Trainer) -> None:
        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            rewrap_ddp(model, find_unused_parameters=self._find_unused)
