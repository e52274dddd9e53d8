"""The frozen-prefix cache of the callbacks: the frozen blocks run once per sample, later steps start from their
cached output.

It needs a stable sample index in every training batch (``index_key``, default ``"idx"``: the sample's position in
the training set, e.g. ``datasets``' ``map(lambda e, i: {"idx": i}, with_indices=True)``). Per training batch:

    fill:   a batch with any id not cached at the frozen boundary ``b`` runs its training step's forward with
            the frozen blocks in eval mode (one fixed value per sample; they run without gradients, since nothing
            before them trains), and block ``b - 1``'s output is stored in an
            :class:`~elastic_pipe.cache.ActivationCache` under (sample id, ``b``) as it passes: the frozen blocks
            run once on the batch, at the training batch's size, as they would without a cache
    serve:  a batch cached whole at ``b`` runs its forward with the frozen modules stubbed out: each returns zeros
            shaped like its output at a fill (nothing reads them), block ``b - 1`` returns the batch's cached
            outputs; everything the model computes outside the blocks (masks, positions) and every block after
            ``b - 1`` runs as usual

A boundary's first fill runs a forward of its own instead (the model's forward on the batch, in eval mode and
without gradients), then again served from the outputs it just stored, and the two model outputs must agree: a
model that passes on more than a block's output (a residual sum outside the blocks) is refused with an
IntegrationError instead of being trained on wrong inputs. Only a checked boundary is served.

So a frozen module computes each sample once per boundary, and again for a hit in a batch with a miss: on one
H100 a forward over a batch's misses alone, of a new size at nearly every step, cost 50-120 ms a step on MiniLM-L6
(``docs/benchmarks.md``), more than recomputing the hits.

    carry:  after a freeze moves the boundary from ``a`` to ``b``, a batch whose samples all have entries at ``a``
            is served from there: its forward runs blocks ``a .. b - 1`` (frozen, in eval mode) and block
            ``b - 1``'s output is stored at ``b`` as it passes. A fill while ``a`` is kept also stores block
            ``a - 1``'s output at ``a``, so that more of the epoch's later batches are whole there. Once ``b``
            holds every sample, ``a``'s entries are let go. Any older boundary is dropped at a freeze, and with
            ``cache_views`` every freeze drops and fills.
The cache lives in the training process's memory, on the model's device, and is not saved with a checkpoint: a
resumed run fills it again. Two limits: the blocks' outputs must be everything the model passes on (true of the
Hugging Face and torchvision blocks, whose residual sums are inside the block), and every sample's boundary output
must have one shape (pad to a fixed length). With dropout in the frozen blocks, the cached outputs are the
eval-mode ones: one fixed value per sample is what a cache can hold.

Random augmentation would replay one epoch's augmented view in every later epoch: the cache is refused under it
(declared, or seen as a ``Random*`` transform on the training set) unless ``cache_views=V`` caches V per-epoch views
on purpose (epoch ``e`` reads view ``e % V``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from elastic_pipe import cache as ep_cache
from elastic_pipe.integrations.blocks import Blocks
from elastic_pipe.integrations.errors import IntegrationError
from elastic_pipe.integrations.probe import first_tensor

__all__ = []  # internal: the callbacks' cache machinery

#: What the data pipeline may declare.
AUGMENTATIONS = ("none", "random")

#: Relative tolerance of the check that a served forward matches the real one (both run the same layers on the
#: same values: they agree to rounding, a model passing on more than a block's output differs by far more).
SERVED_RTOL = 1e-3

#: Names of random transforms (torchvision's ``RandomResizedCrop``, ``RandomHorizontalFlip``, ...).
_RANDOM_TRANSFORM = re.compile(r"\bRandom[A-Z]\w*")


@dataclass(frozen=True)
class CacheSettings:
    """The callbacks' cache options, checked when the callback is built.

    Attributes:
        index_key: where a batch holds the sample indices: a mapping's key, or a tuple's position.
        augmentation: what the data pipeline declares, ``"none"`` or ``"random"``.
        views: per-epoch views cached per sample under random augmentation (None: random augmentation refused).
        budget: bytes the cache may hold on the device (an int or ``"2GiB"``); None: every sample's entry at two
            boundaries (after a freeze, the boundary before it serves the steps that carry its entries to the new
            one, for an epoch).

    Raises:
        IntegrationError: an unknown augmentation, random augmentation without ``views``, views below 1, a bad
            budget or index key.
    """

    index_key: str | int = "idx"
    augmentation: str = "none"
    views: int | None = None
    budget: int | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.index_key, bool) or not isinstance(self.index_key, str | int):
            raise IntegrationError(
                f"index_key must be a batch key (str) or a tuple position (int), got {self.index_key!r}"
            )
        if self.augmentation not in AUGMENTATIONS:
            raise IntegrationError(f"augmentation must be one of {AUGMENTATIONS}, got {self.augmentation!r}")
        views = self.views
        if views is not None and (isinstance(views, bool) or not isinstance(views, int) or views < 1):
            raise IntegrationError(f"cache_views must be an integer >= 1 or None, got {self.views!r}")
        if self.augmentation == "random" and self.views is None:
            raise IntegrationError(
                "cache=True with random augmentation would replay one epoch's augmented view in every later "
                "epoch; pass cache_views=V to cache V per-epoch views on purpose, or cache=False"
            )
        if self.views is not None and self.augmentation != "random":
            raise IntegrationError(f"cache_views={self.views} is for augmentation='random'; the data declares none")
        if self.budget is not None:
            try:
                ep_cache.parse_bytes(self.budget)
            except ValueError as exc:
                raise IntegrationError(f"cache_budget: {exc}") from None

    def build(self, num_samples: int, entry_bytes: int, device: torch.device) -> ep_cache.ActivationCache:
        """The activation cache for ``num_samples`` entries of ``entry_bytes`` each on ``device``."""
        keys = num_samples * (self.views or 1)
        budget = 2 * keys * entry_bytes if self.budget is None else ep_cache.parse_bytes(self.budget)
        return ep_cache.ActivationCache(
            num_samples,
            device_budget=budget,
            device=device,
            augmentation=self.augmentation,
            on_random_augmentation="error" if self.views is None else "views",
            views=self.views or 1,
        )


def random_transforms(dataset: object) -> list[str]:
    """The ``Random*`` transforms on ``dataset`` (its ``transform``/``transforms``, through wrappers' ``dataset``)."""
    found: list[str] = []
    for _ in range(4):  # Subset of a Subset of ...: a few levels
        for name in ("transform", "transforms"):
            found += _RANDOM_TRANSFORM.findall(repr(getattr(dataset, name, None)))
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            break
    return sorted(set(found))


@dataclass(frozen=True)
class _Spec:
    """A tensor of a stubbed module's output: its shape (rows replaced per batch when ``batched``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    batched: bool


def _skeleton(output: Any, rows: int) -> Any:
    if isinstance(output, torch.Tensor):
        batched = output.dim() >= 1 and output.shape[0] == rows
        return _Spec(tuple(output.shape), output.dtype, output.device, batched)
    if isinstance(output, dict):
        return {k: _skeleton(v, rows) for k, v in output.items()}
    if isinstance(output, tuple | list):
        return type(output)(_skeleton(v, rows) for v in output)
    return output


def _rebuild(skeleton: Any, rows: int, first: torch.Tensor | None) -> tuple[Any, torch.Tensor | None]:
    """A stand-in output: zeros for each tensor, ``first`` (cast) for the first one; returns what of ``first`` is
    left unused."""
    if isinstance(skeleton, _Spec):
        if first is not None:
            return first.to(skeleton.dtype), None
        shape = (rows, *skeleton.shape[1:]) if skeleton.batched else skeleton.shape
        return torch.zeros(shape, dtype=skeleton.dtype, device=skeleton.device), None
    if isinstance(skeleton, dict):
        out = {}
        for k, v in skeleton.items():
            out[k], first = _rebuild(v, rows, first)
        return out, first
    if isinstance(skeleton, tuple | list):
        items = []
        for v in skeleton:
            item, first = _rebuild(v, rows, first)
            items.append(item)
        return type(skeleton)(items), first
    return skeleton, first


class PrefixCache:
    """The frozen prefix's outputs per sample, and the stubs that serve them to a training batch's forward.

    Args:
        settings: the callback's cache options.
    """

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings
        self.boundary = 0
        self.blocks: Blocks | None = None
        self.root: nn.Module | None = None
        self.num_samples = 0
        self.cache: ep_cache.ActivationCache | None = None
        #: Rows the frozen prefix computed in fills (what the cache saves is every later read of them).
        self.filled = 0
        #: Rows carried to a new boundary by the steps served from the one before it (no forward of their own).
        self.carried = 0
        self._epoch = 0
        self._older = 0  # the boundary before the last freeze, served while the new one is carried from it
        self._held = 0  # samples with an entry at ``boundary`` (the count ``put`` returns)
        self._batch: torch.Tensor | None = None  # the boundary outputs of the batch being served
        self._served: frozenset[int] = frozenset()  # the modules the batch being served skips
        self._last: nn.Module | None = None  # the one of them that returns ``_batch``
        self._pass: tuple[list[Any], list[tuple[nn.Module, bool]]] | None = None  # hooks and modes of a step's store
        self._skeletons: dict[int, Any] = {}
        self._stubbed: dict[int, nn.Module] = {}
        self._filling = False
        self._verified: set[int] = set()  # the boundaries whose served path was checked against the real one

    # -- setup ---------------------------------------------------------------------------------------------------

    def attach(self, root: nn.Module, blocks: Blocks, dataset: object) -> None:
        """Serve ``root``'s forward (the module whose forward a fill runs) for a training set ``dataset``.

        Raises:
            IntegrationError: the training set has no length, or carries random transforms the settings did not
                declare.
        """
        if not hasattr(dataset, "__len__"):
            raise IntegrationError(
                f"cache=True needs a training set of known length (the sample ids are its positions); "
                f"{type(dataset).__name__} has none"
            )
        randoms = random_transforms(dataset)
        if randoms and self.settings.augmentation != "random":
            raise IntegrationError(
                f"cache=True, but the training set's transform holds random augmentation ({', '.join(randoms)}); "
                "pass augmentation='random' with cache_views=V to cache V per-epoch views, or cache=False"
            )
        self.root, self.blocks, self.num_samples = root, blocks, len(dataset)

    def check_batch(self, batch: Any) -> None:
        """Check that a collated training batch carries the sample indices.

        Raises:
            IntegrationError: it does not (the message says how to add them).
        """
        if self.ids_of(batch) is None:
            key = self.settings.index_key
            raise IntegrationError(
                f"cache=True needs each training batch to carry its samples' dataset positions under {key!r}; "
                "add them (datasets: ds.map(lambda e, i: {'idx': i}, with_indices=True); a torch Dataset: return "
                "the index from __getitem__) and keep the column (HF: TrainingArguments(remove_unused_columns=False))"
            )

    def ids_of(self, batch: Any) -> torch.Tensor | None:
        """The sample indices a batch carries, as a 1-D CPU int64 tensor, or None."""
        key = self.settings.index_key
        if isinstance(batch, Mapping):
            value = batch.get(key) if isinstance(key, str) else None
        elif isinstance(batch, tuple | list) and isinstance(key, int) and -len(batch) <= key < len(batch):
            value = batch[key]
        else:
            value = None
        if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
            return None
        return value.detach().to("cpu", torch.int64).flatten()

    def without_index(self, batch: Any) -> Any:
        """``batch`` without its sample indices (a mapping's key; a tuple's entry stays: positions matter)."""
        if isinstance(batch, Mapping) and isinstance(self.settings.index_key, str):
            return {k: v for k, v in batch.items() if k != self.settings.index_key}
        return batch

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose view reads and writes use (``cache_views``)."""
        self._epoch = max(0, int(epoch))
        if self.cache is not None:
            self.cache.set_epoch(self._epoch)

    def set_boundary(self, frozen: int) -> None:
        """The frozen count now: stub the frozen modules; keep the entries of the boundary before (the new one is
        carried from them by the steps, see :meth:`prepare`) and drop any older ones."""
        if frozen == self.boundary:
            return
        self._end_pass()
        keep = self.boundary if self._carries_from(self.boundary, frozen) else 0
        if self.cache is not None:
            for boundary in self.cache.boundaries():
                if boundary != keep:
                    self.cache.drop(boundary)
        self._older, self.boundary, self._held = keep, frozen, 0
        for module in self._need_blocks().modules(0, frozen):
            if id(module) not in self._stubbed:
                self._stub(module)

    def close(self) -> None:
        """Take the stubs off and free the entries (the model is as it was, its frozen flags aside)."""
        for module in self._stubbed.values():
            del module.forward
        self._stubbed.clear()
        self._skeletons.clear()
        self._end_pass()
        self._batch = None
        self.boundary = self._older = self._held = 0  # a later run stubs its frozen modules again
        self._verified.clear()
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    # -- per batch -----------------------------------------------------------------------------------------------

    def prepare(self, ids: torch.Tensor, run: Callable[[], object]) -> None:
        """Before a training batch's forward: serve the batch's boundary outputs, or store them as it runs.

        A batch cached whole at the (checked) boundary is served from it. After a freeze, a batch cached whole at
        the boundary before it is served from there instead, and the newly frozen blocks' output is stored at the
        new boundary as the forward passes it (a carry). Any other batch fills in its own forward: the frozen
        blocks run in eval mode and block ``boundary - 1``'s output is stored as it passes. A boundary's first
        fill runs a forward of its own to check the served path first (see the module's docstring).

        Args:
            ids: the batch's sample indices (1-D, CPU).
            run: runs the model's forward on the batch (for a boundary's first fill).

        Raises:
            IntegrationError: an index outside the training set, a boundary output whose shape differs from the
                cached ones, or a forward that does not reach the boundary block.
        """
        self._batch = None
        if self.boundary == 0:
            return
        values = self._whole(ids, self.boundary) if self.boundary in self._verified else None
        older = self._whole(ids, self._older) if values is None and self._older else None
        if values is not None:
            self._serve(self.boundary, values)
        elif older is not None:
            self._serve(self._older, older)
            self._pass_through(ids, self._older)
        elif self.boundary in self._verified:
            self._pass_through(ids, 0)
        else:
            self._serve(self.boundary, self._first_fill(ids, run))

    def release(self) -> None:
        """After a training batch's forward (or for any forward that is not one): the modules compute again."""
        if not self._filling:  # a first fill's own forwards (through the model's hooks) keep what it serves
            self._batch = None
            self._end_pass()

    def _whole(self, ids: torch.Tensor, boundary: int) -> torch.Tensor | None:
        """The batch's entries at ``boundary`` when it holds all of them, else None (a partial batch reads and
        counts nothing: the index alone says so).

        Raises:
            IntegrationError: an index outside the training set (the cache's own error, named for the callback's
                users), at whichever boundary is looked up.
        """
        if self.cache is None:
            return None
        try:
            if not bool(self.cache.cached(ids, boundary).all()):
                return None
            lookup = self.cache.get(ids, boundary)
        except ep_cache.CacheError as exc:
            raise IntegrationError(f"cache: the batch's {self.settings.index_key!r} values: {exc}") from None
        return lookup.values if bool(lookup.hit.all()) else None

    def _serve(self, boundary: int, values: torch.Tensor) -> None:
        """Serve ``values`` (the outputs of block ``boundary - 1``) to the next forward, skipping blocks before it."""
        blocks = self._need_blocks()
        self._batch = values
        self._served = frozenset(id(m) for m in blocks.modules(0, boundary))
        self._last = blocks.outputs()[boundary - 1]

    def _carries_from(self, old: int, new: int) -> bool:
        """Whether the steps may carry a freeze from ``old`` to ``new`` (one view per sample, a checked boundary
        with entries)."""
        return (
            0 < old < new
            and (self.settings.views or 1) == 1
            and old in self._verified
            and self.cache is not None
            and old in self.cache.boundaries()
        )

    def _pass_through(self, ids: torch.Tensor, start: int) -> None:
        """During the next forward, run the frozen blocks ``start .. boundary - 1`` in eval mode (one fixed value
        per sample, as a first fill computes them) and store block ``boundary - 1``'s output for ``ids`` as it
        passes; from the inputs (``start`` 0) also block ``_older - 1``'s, while that boundary is kept."""
        blocks = self._need_blocks()
        modes = [(m, m.training) for unit in blocks.modules(start, self.boundary) for m in unit.modules()]
        for module, _ in modes:
            module.training = False  # each module's own flag: put back as it was, not the block's
        rows, outputs = ids.numel(), blocks.outputs()
        targets = [self.boundary] + ([self._older] if start == 0 and self._older else [])

        def hook(boundary: int) -> Callable[[nn.Module, object, object], None]:
            def store(_module: nn.Module, _args: object, output: object) -> None:
                if boundary == self.boundary:
                    self._end_pass()  # the last frozen block: the rest of the forward trains as usual
                h = first_tensor(output)
                if h is None or h.shape[0] != rows:
                    raise IntegrationError(
                        f"cache: block {boundary - 1} ({blocks.where}) returned no tensor with {rows} rows"
                    )
                self._store(ids, h.detach(), boundary)
                if boundary == self.boundary:
                    if start:
                        self.carried += rows
                    else:
                        self.filled += rows

            return store

        handles = [outputs[b - 1].register_forward_hook(hook(b)) for b in targets]
        self._pass = (handles, modes)

    def _end_pass(self) -> None:
        if self._pass is None:
            return
        handles, modes = self._pass
        self._pass = None
        for handle in handles:
            handle.remove()
        for module, was in modes:
            module.training = was

    def _check_served(self, real: object, served: object) -> None:
        """The model's output on a fill's rows, computed through the frozen blocks and served from their cached
        outputs, must agree: else the model passes on more than a block's output (a residual sum outside it)."""
        a, b = first_tensor(real), first_tensor(served)
        if a is None or b is None:
            return
        scale = max(1.0, float(a.abs().max()))
        if a.shape != b.shape or not torch.allclose(a.float(), b.float(), rtol=SERVED_RTOL, atol=SERVED_RTOL * scale):
            gap = float((a.float() - b.float()).abs().max()) if a.shape == b.shape else math.inf
            raise IntegrationError(
                f"cache: the model's output changes when blocks 0..{self.boundary - 1} are served from the cache "
                f"(largest difference {gap:.3g}); a block's output must be all the model passes on - a residual "
                "sum outside the blocks (h = h + block(h)) needs blocks that hold it, or cache=False"
            )

    def _first_fill(self, ids: torch.Tensor, run: Callable[[], object]) -> torch.Tensor:
        """A boundary's first fill: the batch's forward in eval mode and without gradients (the frozen modules'
        output shapes recorded for their stubs), then again served from the outputs it stored; the two model
        outputs must agree (:meth:`_check_served`)."""
        blocks, root = self._need_blocks(), self.root
        assert root is not None
        rows = ids.numel()
        last = blocks.outputs()[self.boundary - 1]
        older = blocks.outputs()[self._older - 1] if self._older else None
        captured: list[torch.Tensor] = []
        at_older: list[torch.Tensor] = []  # block ``_older - 1``'s output, stored there too (see _pass_through)

        def record(module: nn.Module, _args: object, output: object) -> None:
            if (module is last or module is older) and (h := first_tensor(output)) is not None:
                (captured if module is last else at_older).append(h.detach())
            self._skeletons[id(module)] = _skeleton(output, rows)

        handles = [m.register_forward_hook(record) for m in blocks.modules(0, self.boundary)]
        was = root.training
        root.eval()
        self._filling = True
        try:
            with torch.no_grad():
                try:
                    real = run()
                finally:
                    for handle in handles:
                        handle.remove()
                if captured:
                    self._serve(self.boundary, captured[0])
                    self._check_served(real, run())
                    self._verified.add(self.boundary)
        finally:
            self._filling, self._batch = False, None
            root.train(was)
        if not captured:
            raise IntegrationError(
                f"cache: the forward did not run block {self.boundary - 1} ({blocks.where}) or it returned no tensor"
            )
        values = captured[0]
        if values.shape[0] != rows:
            raise IntegrationError(
                f"cache: block {self.boundary - 1} returned {values.shape[0]} rows for {rows} samples; expected "
                "the batch dimension first"
            )
        self.filled += rows
        if at_older and at_older[0].shape[0] == rows:
            self._store(ids, at_older[0], self._older)
        self._store(ids, values, self.boundary)
        return values

    def _store(self, ids: torch.Tensor, values: torch.Tensor, boundary: int) -> None:
        """Store ``values`` at ``boundary``; once the current boundary holds every sample, let the older one go."""
        if self.cache is None:
            entry = math.prod(values.shape[1:]) * values.element_size()
            self.cache = self.settings.build(self.num_samples, entry, values.device)
            self.cache.set_epoch(self._epoch)
        try:
            stored = self.cache.put(ids, boundary, values)
        except ep_cache.CacheError as exc:
            raise IntegrationError(
                f"cache: {exc}; expected every sample's boundary output to have one shape (pad the samples to a "
                "fixed length) and indices in [0, len(training set))"
            ) from None
        if boundary == self.boundary:
            self._held += stored
            if self._older and self._held >= self.num_samples:
                self.cache.drop(self._older)  # the new boundary holds every sample: the old one has served
                self._older = 0

    def _stub(self, module: nn.Module) -> None:
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self._batch is None or id(module) not in self._served:
                return original(*args, **kwargs)
            skeleton = self._skeletons.get(id(module))
            if skeleton is None:
                raise IntegrationError(f"cache: {type(module).__name__} was stubbed before any fill ran it")
            first = self._batch if module is self._last else None
            return _rebuild(skeleton, int(self._batch.shape[0]), first)[0]

        module.forward = forward
        self._stubbed[id(module)] = module

    def _need_blocks(self) -> Blocks:
        if self.blocks is None:
            raise IntegrationError("the prefix cache is not attached to a model yet")
        return self.blocks
