"""What a rank reads: the training and evaluation parts of the data, and the check of their items.

Two kinds of data, one interface (:class:`StepData`):

* :class:`~elastic_pipe.orchestrator.workload.Split`: tensors held in memory, indexed directly (the fast path of the
  built-in datasets);
* :class:`DatasetSplit`: an index subset of any map-style dataset (``__len__`` and ``__getitem__`` returning
  ``(input, label)``, e.g. a ``torch.utils.data.Dataset``), read through a ``torch.utils.data.DataLoader`` with
  ``[data] workers`` worker processes; nothing is stacked into memory. Its loaders persist across epochs
  (:mod:`~elastic_pipe.orchestrator.loader_pool`: one per way of reading it, rebuilt when the sampler re-shards),
  and a step that needs only labels (every sample's prefix output cached) reads them from the dataset's ``targets``
  or ``labels`` when it has them (:func:`label_table`), decoding nothing.

Either way a step's indices come from the :class:`~elastic_pipe.data.ElasticSampler` through
:class:`~elastic_pipe.orchestrator.epoch_steps.ElasticBatchSampler`; :mod:`~elastic_pipe.orchestrator.epoch_steps`
cuts the epoch into steps.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
import torch.utils.data

from elastic_pipe.orchestrator.epoch_steps import ElasticBatchSampler
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.loader_pool import BuildLoader, LoaderKey, LoaderPool

__all__ = [
    "Batch",
    "DatasetSplit",
    "ItemSpec",
    "StepData",
    "item_spec",
    "label_table",
    "nonfinite_problem",
]


class Batch(NamedTuple):
    """One batch as a rank reads it.

    Attributes:
        positions: the samples' positions in the part (host, int64); the part's ``sample_ids[positions]`` are
            their ids.
        inputs: the inputs on the device, or ``None`` when not asked for.
        labels: the labels on the device, or ``None`` when not asked for.
    """

    positions: torch.Tensor
    inputs: torch.Tensor | None
    labels: torch.Tensor | None


class StepData(Protocol):
    """A training or evaluation part of the data, as the step loop, the evaluation and the cache read it."""

    @property
    def sample_ids(self) -> torch.Tensor:
        """A stable id per position (what the activation cache keys on)."""
        ...

    def __len__(self) -> int: ...

    def input_rows(self, start: int, stop: int) -> torch.Tensor:
        """The inputs of positions ``start:stop`` (where the part keeps them)."""
        ...

    def batches(
        self, index_lists: Iterable[Sequence[int]], *, inputs: bool, labels: bool, device: torch.device
    ) -> Iterator[Batch]:
        """One :class:`Batch` per list of positions, in order."""
        ...


# --------------------------------------------------------------------------------------------- the items
@dataclass(frozen=True)
class ItemSpec:
    """What every item of a dataset must look like (item 0's shapes and dtypes).

    Attributes:
        input_shape, input_dtype: the input's.
        label_shape, label_dtype: the label's.
        num_classes: labels must lie in ``[0, num_classes)`` (integer labels; ``None``: not checked).
        on_host: whether item 0's input is in host memory (a dataset holding its items on a GPU is read without
            pinned memory, which only host tensors have).
    """

    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    label_shape: tuple[int, ...]
    label_dtype: torch.dtype
    num_classes: int | None = None
    on_host: bool = True

    def check(self, index: int, x: torch.Tensor, y: torch.Tensor) -> str | None:
        """Why item ``index`` (``(x, y)``) does not fit, or ``None``."""
        if tuple(x.shape) != self.input_shape or x.dtype != self.input_dtype:
            return (
                f"dataset item {index}: input {tuple(x.shape)} {x.dtype} differs from item 0's "
                f"{self.input_shape} {self.input_dtype}"
            )
        if tuple(y.shape) != self.label_shape or y.dtype != self.label_dtype:
            return (
                f"dataset item {index}: label {tuple(y.shape)} {y.dtype} differs from item 0's "
                f"{self.label_shape} {self.label_dtype}"
            )
        if self.num_classes is not None and not y.is_floating_point() and y.numel():
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= self.num_classes:
                bad = lo if lo < 0 else hi
                return f"dataset item {index}: label {bad} is out of range [0, {self.num_classes})"
        return None

    def with_classes(self, num_classes: int | None) -> ItemSpec:
        """This spec, checking labels against ``num_classes``."""
        return dataclasses.replace(self, num_classes=num_classes)


@dataclass(frozen=True)
class _Unreadable:
    """What reading an item raised (an ``OSError``: a missing or unreadable file), carried to the collate step,
    which names the item (and the path the error names)."""

    reason: str


def _read_item(dataset: Any, index: int) -> Any:
    try:
        return dataset[index]
    except OSError as exc:
        return _Unreadable(f"{type(exc).__name__}: {exc}")


def _as_pair(index: int, item: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(item, _Unreadable):
        raise ConfigError(f"dataset item {index} cannot be read: {item.reason}")
    if not (isinstance(item, tuple | list) and len(item) == 2):
        raise ConfigError(f"dataset item {index} is {type(item).__name__}, expected an (input, label) pair")
    try:
        x, y = (torch.as_tensor(v) for v in item)
    except (TypeError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"dataset item {index}: {exc} (the dataset's transform must return tensors or arrays)"
        ) from None
    return x, y


def item_spec(dataset: Any, num_classes: int | None = None) -> ItemSpec:
    """The :class:`ItemSpec` of ``dataset``'s item 0."""
    x, y = _as_pair(0, _read_item(dataset, 0))
    return ItemSpec(tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, num_classes, x.device.type == "cpu")


#: The dataset attributes :func:`label_table` reads labels from, in this order (torchvision's, then ours).
LABEL_ATTRIBUTES = ("targets", "labels")


def label_table(dataset: Any, spec: ItemSpec) -> torch.Tensor | None:
    """Every item's label without reading an item: the dataset's ``targets`` or ``labels`` attribute, when it is a
    sequence, array or tensor with one label per item shaped like item 0's (cast to its dtype); ``None`` when there
    is none, or when the dataset has a ``target_transform`` (torchvision's: then ``targets`` are not what
    ``__getitem__`` returns).

    Raises:
        ConfigError: a label out of ``[0, spec.num_classes)`` (naming the item).
    """
    table, failure = _label_table(dataset, spec)
    if failure is not None:
        raise ConfigError(failure[1])
    return table


def _label_table(dataset: Any, spec: ItemSpec) -> tuple[torch.Tensor | None, tuple[int, str] | None]:
    """:func:`label_table`, and the first item whose label is out of range ``(index, reason)`` instead of raising."""
    if getattr(dataset, "target_transform", None) is not None:
        return None, None
    n = len(dataset)
    for name in LABEL_ATTRIBUTES:
        values = getattr(dataset, name, None)
        if values is None or callable(values):
            continue
        try:
            table = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError):
            continue
        if table.dim() == 0 or table.shape[0] != n or tuple(table.shape[1:]) != spec.label_shape:
            continue
        if table.is_floating_point() != spec.label_dtype.is_floating_point:
            continue
        table = table.to("cpu", spec.label_dtype)
        if spec.num_classes is not None and not table.is_floating_point() and table.numel():
            rows = table.reshape(n, -1)
            bad = ((rows < 0) | (rows >= spec.num_classes)).any(dim=1).nonzero().flatten()
            if bad.numel():
                index = int(bad[0])
                row = rows[index]
                value = int(row[(row < 0) | (row >= spec.num_classes)][0])
                reason = (
                    f"dataset item {index}: label {value} (the dataset's {name}) is out of range "
                    f"[0, {spec.num_classes})"
                )
                return None, (index, reason)
        return table, None
    return None, None


class _Items(torch.utils.data.Dataset[tuple[int, Any]]):
    """Position ``p`` of a split -> ``(dataset index, raw item)``: what the loader's workers fetch."""

    def __init__(self, dataset: Any, indices: torch.Tensor) -> None:
        self.dataset = dataset
        self.indices = indices.tolist()

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, Any]:
        index = self.indices[position]
        return index, _read_item(self.dataset, index)


def nonfinite_problem(index: int, x: Any, y: Any) -> str | None:
    """Why dataset item ``index`` cannot be trained on because of NaN or infinite values, or ``None``."""
    for what, t in (("input", x), ("label", y)):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = t[~torch.isfinite(t)].reshape(-1)[0].item()
            return (
                f"dataset item {index}: its {what} holds a non-finite value ({bad}); [data] check refuses NaN "
                "and infinity"
            )
    return None


@dataclass(frozen=True)
class _Collate:
    """Checks and stacks a batch of raw items (in the loader's workers): ``(dataset indices, inputs, labels)``.

    ``dtype``: floating inputs are cast to it; ``None`` leaves them as the dataset made them (a loader's batch is
    cast on the device, after its copy: a dataset of bfloat16 items crosses to the device at half the bytes).

    ``scan``: return the first failure ``(index, reason)`` instead of raising (the up-front check), which also
    compares each item's label with ``table`` (the dataset's :func:`label_table`, by dataset index) when given.
    """

    spec: ItemSpec
    dtype: torch.dtype | None
    inputs: bool
    labels: bool
    scan: bool = False
    table: torch.Tensor | None = None

    def __call__(self, items: list[tuple[int, Any]]) -> Any:
        xs, ys = [], []
        for index, item in items:
            try:
                x, y = _as_pair(index, item)
            except ConfigError as exc:
                if self.scan:
                    return index, str(exc)
                raise
            reason = self.spec.check(index, x, y)
            if reason is None and self.scan:  # the up-front check only: a step never pays for it
                reason = nonfinite_problem(index, x, y)
            if reason is None and self.table is not None and not torch.equal(y, self.table[index]):
                reason = (
                    f"dataset item {index}: label {y.tolist()} differs from the dataset's targets/labels "
                    f"({self.table[index].tolist()}), which a step reads when only labels are needed"
                )
            if reason is not None:
                if self.scan:
                    return index, reason
                raise ConfigError(reason)
            xs.append(x)
            ys.append(y)
        if self.scan:
            return None
        # default_collate stacks into shared memory when it runs in a loader worker, so the batch reaches the
        # training process without the extra copy torch.stack's private result takes on its way there
        x_all = torch.utils.data.default_collate(xs) if self.inputs else None
        if x_all is not None and self.dtype is not None:
            x_all = cast_floating(x_all, self.dtype)
        return x_all, torch.utils.data.default_collate(ys) if self.labels else None


def cast_floating(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``dtype`` when it is floating (integer inputs, token ids say, stay as they are)."""
    return x.to(dtype) if x.is_floating_point() else x


#: How the loaders' worker processes start: forked where the platform has ``fork`` (Linux), whatever this process's
#: own start method is. A rank started by ``elastic-pipe train`` is a spawned process, whose default start method is
#: then ``spawn`` as well: each loader's workers would import torch, the model's modules and the dataset again and
#: receive the dataset pickled (5-6 s per loader start on a 2-core machine, at every epoch's first step and every
#: evaluation of a 2-epoch run; forked, a fraction of a second). The workers only map positions to items, and the
#: pinned cache slab is left out of forks (``MADV_DONTFORK``). ``None`` (the platform's default) elsewhere.
WORKER_START: str | None = "fork" if sys.platform.startswith("linux") else None

#: The fewest positions a worker reads of one list (:meth:`DatasetSplit._cut`): smaller parts cost more in
#: hand-offs between processes than reading them side by side saves.
MIN_PART = 32


class _Parts:
    """The parts of each of ``lists``, in order: what a split's loader reads (its batch sampler's lists)."""

    def __init__(self, lists: Iterable[Sequence[int]], cut: Callable[[Sequence[int]], list[Sequence[int]]]) -> None:
        self.lists, self.cut = lists, cut

    def __iter__(self) -> Iterator[Sequence[int]]:
        for positions in self.lists:
            yield from self.cut(positions)


def _joined(parts: list[torch.Tensor | None], device: torch.device) -> torch.Tensor | None:
    """The parts of one list's batch, one after the other in one tensor on ``device`` (copied there without
    waiting, from pinned memory when the loader pins)."""
    if parts[0] is None:
        return None
    if len(parts) == 1:
        return parts[0].to(device, non_blocking=True)
    tensors = [p for p in parts if p is not None]
    first = tensors[0]
    rows = sum(int(p.shape[0]) for p in tensors)
    out = torch.empty((rows, *first.shape[1:]), dtype=first.dtype, device=device)
    row = 0
    for part in tensors:
        out[row : row + part.shape[0]].copy_(part, non_blocking=True)
        row += int(part.shape[0])
    return out


@dataclass(frozen=True)
class DatasetSplit:
    """An index subset of a map-style dataset (train or eval part), read through a ``DataLoader``.

    The inputs are taken as the dataset returns them (its transforms do their own normalisation); floating inputs
    are only cast to ``dtype``, the parameters' dtype, on the device once a batch is there (so that a dataset whose
    items are bfloat16 moves half the bytes of float32 ones from its workers to the device).

    Attributes:
        dataset: ``dataset[i]`` is ``(input, label)``.
        indices: the dataset indices of this part, in position order (also its sample ids).
        spec: what every item must look like.
        dtype: floating inputs are cast to it.
        workers: the loader's worker processes (0: read in the training process).

    Its loaders are kept (:class:`~elastic_pipe.orchestrator.loader_pool.LoaderPool`): their workers live across
    epochs; :meth:`close` shuts them down.
    """

    dataset: Any
    indices: torch.Tensor
    spec: ItemSpec
    dtype: torch.dtype = torch.float32
    workers: int = 0
    _pool: LoaderPool = field(default_factory=LoaderPool, init=False, repr=False, compare=False)
    _labels: dict[str, torch.Tensor | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def sample_ids(self) -> torch.Tensor:
        """The dataset indices (what the cache keys on)."""
        return self.indices

    @property
    def random_augmentation(self) -> bool:
        """Whether the dataset declares its transforms random (``random_augmentation = True``)."""
        return bool(getattr(self.dataset, "random_augmentation", False))

    def with_classes(self, num_classes: int | None) -> DatasetSplit:
        """This part, checking labels against ``num_classes``."""
        return dataclasses.replace(self, spec=self.spec.with_classes(num_classes))

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def loaders_built(self) -> int:
        """Loaders constructed for :meth:`batches` so far (each one a start of its worker processes)."""
        return self._pool.built

    def labels_by_position(self) -> torch.Tensor | None:
        """Every position's label from the dataset's :func:`label_table` (``None``: the dataset has none); built
        once."""
        if "table" not in self._labels:
            table = label_table(self.dataset, self.spec)
            self._labels["table"] = None if table is None else table[self.indices]
        return self._labels["table"]

    def close(self) -> None:
        """Shut down the kept loaders' workers (a later :meth:`batches` builds new ones)."""
        self._pool.close()

    def _loader(
        self, batch_sampler: Iterable[Sequence[int]], collate: _Collate, pin: bool, *, persistent: bool = False
    ) -> Any:
        # A list is read in up to ``workers`` parts (:meth:`_cut`), so twice as many parts per worker as lists
        # keep as many lists read ahead as one part per list would.
        return torch.utils.data.DataLoader(
            _Items(self.dataset, self.indices),
            batch_sampler=batch_sampler,  # type: ignore[arg-type]  # any iterable of index lists works
            num_workers=self.workers,
            collate_fn=collate,
            pin_memory=pin,
            persistent_workers=persistent and self.workers > 0,
            prefetch_factor=2 * self.workers if self.workers > 1 else None,
            multiprocessing_context=WORKER_START if self.workers > 0 else None,
        )

    def _build(self, key: LoaderKey, collate: _Collate) -> BuildLoader:
        """What the pool calls to build a loader for ``key`` (:meth:`_loader` with ``collate``, pinned as ``key``
        says)."""

        def build(batch_sampler: Iterable[Sequence[int]], persistent: bool) -> Any:
            return self._loader(batch_sampler, collate, key.pin, persistent=persistent)

        return build

    def _cut(self, positions: Sequence[int]) -> list[Sequence[int]]:
        """``positions`` in consecutive parts of nearly equal length, one per worker but at least
        :data:`MIN_PART` positions each (one part without workers): the parts of one list are read by different
        workers at the same time, so a list's batch is ready in a fraction of the time one worker takes for all
        of it (the first step of an epoch waits for it)."""
        k = max(1, min(self.workers, len(positions) // MIN_PART))
        q, r = divmod(len(positions), k)
        bounds = [i * q + min(i, r) for i in range(k + 1)]
        return [positions[bounds[i] : bounds[i + 1]] for i in range(k)]

    def _read(
        self, key: LoaderKey, lists: Iterable[Sequence[int]], collate: _Collate
    ) -> Iterator[tuple[Sequence[int], list[Any]]]:
        """Per list, the list and the collated batches of its parts (:meth:`_cut`), from the pool's loader for
        ``key``."""
        reader = self._pool.read(key, _Parts(lists, self._cut), self._build(key, collate))
        try:
            for positions in lists:
                yield positions, [next(reader) for _ in self._cut(positions)]
        finally:
            reader.close()

    def _key(
        self, kind: str, inputs: bool, labels: bool, device: torch.device, shard: tuple[int, int] | None
    ) -> LoaderKey:
        return LoaderKey(kind, inputs, labels, device.type == "cuda" and self.spec.on_host, shard)

    def start_steps(self, *, inputs: bool, labels: bool, device: torch.device, shard: tuple[int, int]) -> bool:
        """Start the workers of the loader that :meth:`batches` will read the training steps through, for a
        sampler sharded ``shard`` (``(replicas, rank)``), before the first step asks for a batch: the trainer
        calls it as it enters a layout, so the workers start while it builds the stage and the cache rather than
        at the epoch's first step. Nothing happens without workers, for a step that reads nothing or only labels
        the dataset has (:meth:`labels_by_position`), or when that loader is already kept. Returns whether
        workers were started."""
        if self.workers == 0 or not (inputs or (labels and self.labels_by_position() is None)):
            return False
        key = self._key("steps", inputs, labels, device, shard)
        return self._pool.start(key, self._build(key, _Collate(self.spec, None, inputs, labels)))

    def batches(
        self, index_lists: Iterable[Sequence[int]], *, inputs: bool, labels: bool, device: torch.device
    ) -> Iterator[Batch]:
        """One batch per list of positions, read by the split's kept loader for this way of reading (its workers
        read ahead, and live on for the next call); labels alone come from :meth:`labels_by_position` when the
        dataset has them."""
        steps = isinstance(index_lists, ElasticBatchSampler)
        lists = index_lists if steps else [list(i) for i in index_lists]
        if not (inputs or labels):  # a middle stage: nothing to read
            for positions in lists:
                yield Batch(torch.tensor(positions, dtype=torch.long), None, None)
            return
        if not steps and not lists:  # nothing to read (a fill with every entry carried): no workers started
            return
        table = None if inputs else self.labels_by_position()
        if table is not None:  # labels only, and the dataset has them: no item is read
            for positions in lists:
                pos = torch.tensor(positions, dtype=torch.long)
                yield Batch(pos, None, table[pos].to(device, non_blocking=True))
            return
        shard = None
        if isinstance(lists, ElasticBatchSampler):
            shard = (lists.sampler.num_replicas, lists.sampler.rank)
        key = self._key("steps" if steps else "lists", inputs, labels, device, shard)
        collate = _Collate(self.spec, None, inputs, labels)  # cast on the device, below
        for positions, parts in self._read(key, lists, collate):
            x = _joined([p[0] for p in parts], device)
            y = _joined([p[1] for p in parts], device)
            yield Batch(
                torch.tensor(positions, dtype=torch.long),
                None if x is None else cast_floating(x, self.dtype),
                y,
            )

    def input_rows(self, start: int, stop: int) -> torch.Tensor:
        """The inputs of positions ``start:stop`` on the host (the set-up's profile, the cache's payoff measure and
        fill chunks): read in parts by the split's workers when it has several (a kept loader of its own, so its
        workers start once), in this process otherwise."""
        positions = list(range(start, min(stop, len(self))))
        if len(self._cut(positions)) > 1:
            key = LoaderKey("rows", inputs=True, labels=False, pin=False)
            ((_, parts),) = self._read(key, [positions], _Collate(self.spec, None, inputs=True, labels=False))
            return cast_floating(torch.cat([x for x, _ in parts]), self.dtype)
        items = [(int(i), _read_item(self.dataset, int(i))) for i in self.indices[start:stop]]
        x, _ = _Collate(self.spec, self.dtype, inputs=True, labels=False)(items)
        assert x is not None
        return x  # type: ignore[no-any-return]

    def inputs_of(self, indices: Sequence[int]) -> torch.Tensor:
        """The inputs of the dataset items ``indices`` (dataset indices, i.e. sample ids), read in this process:
        what a step whose inputs were not loaded reads for the samples its cache lookup missed."""
        items = [(int(i), _read_item(self.dataset, int(i))) for i in indices]
        x, _ = _Collate(self.spec, self.dtype, inputs=True, labels=False)(items)
        assert x is not None
        return x  # type: ignore[no-any-return]

    def first_bad_item(self, rank: int, world_size: int, chunk: int = 256) -> tuple[int, str] | None:
        """Read positions ``rank, rank + world_size, ...`` and return the first that fails :attr:`spec`."""
        mine = list(range(rank, len(self), world_size))
        lists = [mine[i : i + chunk] for i in range(0, len(mine), chunk)]
        table, bad = _label_table(self.dataset, self.spec)  # a step reading labels alone reads these
        collate = _Collate(self.spec, self.dtype, True, True, scan=True, table=table)
        for failure in self._loader(lists, collate, pin=False):
            if failure is not None:
                found = int(failure[0]), str(failure[1])
                return found if bad is None else min(found, bad)
        return bad
