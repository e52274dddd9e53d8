"""A training or evaluation part of a map-style dataset (:class:`DatasetSplit`), never stacked into memory but read
through kept ``DataLoader``\\ s (:mod:`~elastic_pipe.orchestrator.data.loader_pool`) whose workers fetch and stack
the items (:mod:`~elastic_pipe.orchestrator.data.items`); and the split of what is trained on into its two parts
(:func:`split_data`; samples held in memory are split by :mod:`~elastic_pipe.orchestrator.data.workload`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeAlias

import torch
import torch.utils.data

from elastic_pipe.orchestrator.data.epoch_steps import ElasticBatchSampler
from elastic_pipe.orchestrator.data.items import (
    Collate,
    Items,
    ItemSpec,
    Pair,
    Scan,
    cast_floating,
    item_spec,
    label_table,
    label_table_and_failure,
    read_inputs,
)
from elastic_pipe.orchestrator.data.loader_pool import (
    BuildLoader,
    LoaderKey,
    LoaderPool,
    Parts,
    cut,
    joined,
    make_loader,
    stop_workers,
)
from elastic_pipe.orchestrator.data.step_data import Batch, MapDataset
from elastic_pipe.orchestrator.data.workload import Data, Split, eval_count, is_samples, own_eval_samples, split_samples
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["DatasetSplit", "close_splits", "split_data"]


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

    Its loaders are kept (:class:`~elastic_pipe.orchestrator.data.loader_pool.LoaderPool`): their workers live
    across epochs; :meth:`close` shuts them down.
    """

    dataset: MapDataset
    indices: torch.Tensor
    spec: ItemSpec
    dtype: torch.dtype = torch.float32
    workers: int = 0
    _pool: LoaderPool[Pair] = field(default_factory=LoaderPool, init=False, repr=False, compare=False)
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
        return replace(self, spec=self.spec.with_classes(num_classes))

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
        self, batch_sampler: Iterable[list[int]], collate: Collate | Scan, pin: bool, *, persistent: bool = False
    ) -> torch.utils.data.DataLoader[tuple[int, object]]:
        items = Items(self.dataset, self.indices)
        return make_loader(items, batch_sampler, collate, workers=self.workers, pin=pin, persistent=persistent)

    def _build(self, key: LoaderKey, collate: Collate) -> BuildLoader[Pair]:
        """What the pool calls to build a loader for ``key``: :meth:`_loader` with ``collate``, pinned by ``key``."""

        def build(
            batch_sampler: Iterable[list[int]], persistent: bool
        ) -> torch.utils.data.DataLoader[tuple[int, object]]:
            return self._loader(batch_sampler, collate, key.pin, persistent=persistent)

        return build

    def _read(
        self, key: LoaderKey, lists: Iterable[list[int]], collate: Collate
    ) -> Iterator[tuple[list[int], list[Pair]]]:
        """Per list, the list and the collated batches of its parts (:func:`~.loader_pool.cut`), from the pool's
        loader for ``key``, or one covering it unless the items are random (a resume must read them as its run did)."""
        parts = Parts(lists, self.workers)
        reader = self._pool.read(key, parts, self._build(key, collate), cover=not self.random_augmentation)
        try:
            for positions in lists:
                yield positions, [next(reader) for _ in cut(positions, self.workers)]
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
        return self._pool.start(key, self._build(key, Collate(self.spec, None, inputs, labels)))

    def batches(
        self, index_lists: Iterable[Sequence[int]], *, inputs: bool, labels: bool, device: torch.device
    ) -> Iterator[Batch]:
        """One batch per list of positions, read by the split's kept loader for this way of reading (its workers
        read ahead, and live on for the next call); labels alone come from :meth:`labels_by_position` when the
        dataset has them."""
        lists: Iterable[list[int]]
        if isinstance(index_lists, ElasticBatchSampler):
            lists, steps = index_lists, True
        else:
            lists, steps = [list(i) for i in index_lists], False
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
        collate = Collate(self.spec, None, inputs, labels)  # cast on the device, below
        for positions, parts in self._read(key, lists, collate):
            # a covering loader (see _read) may stack parts not asked for: they are dropped
            x = joined([p[0] for p in parts], device) if inputs else None
            y = joined([p[1] for p in parts], device) if labels else None
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
        if len(cut(positions, self.workers)) > 1:
            key = LoaderKey("rows", inputs=True, labels=False, pin=False)
            ((_, parts),) = self._read(key, [positions], Collate(self.spec, None, inputs=True, labels=False))
            return cast_floating(torch.cat([x for x, _ in parts if x is not None]), self.dtype)
        return read_inputs(self.dataset, self.indices[start:stop].tolist(), self.spec, self.dtype)

    def inputs_of(self, indices: Sequence[int]) -> torch.Tensor:
        """The inputs of the dataset items ``indices`` (dataset indices, i.e. sample ids), read in this process:
        what a step whose inputs were not loaded reads for the samples its cache lookup missed."""
        return read_inputs(self.dataset, indices, self.spec, self.dtype)

    def first_bad_item(self, rank: int, world_size: int, chunk: int = 256) -> tuple[int, str] | None:
        """Read positions ``rank, rank + world_size, ...`` and return the first that fails :attr:`spec`."""
        mine = list(range(rank, len(self), world_size))
        lists = [mine[i : i + chunk] for i in range(0, len(mine), chunk)]
        table, bad = label_table_and_failure(self.dataset, self.spec)  # a step reading labels alone reads these
        for failure in self._loader(lists, Scan(self.spec, table), pin=False):
            if failure is not None:
                found = int(failure[0]), str(failure[1])
                return found if bad is None else min(found, bad)
        return bad


#: A training or evaluation part as :func:`split_data` makes it.
Part: TypeAlias = Split | DatasetSplit


def close_splits(parts: Iterable[object]) -> None:
    """Shut down the kept loaders of every :class:`DatasetSplit` among ``parts`` (the run's training and evaluation
    parts, say; samples in memory have none) all side by side (:func:`~.loader_pool.stop_workers`), not one part
    after the other."""
    stop_workers(*(loader for part in parts if isinstance(part, DatasetSplit) for loader in part._pool.take()))


def split_dataset(
    dataset: MapDataset,
    eval_fraction: float,
    seed: int,
    dtype: torch.dtype,
    *,
    workers: int = 0,
    num_classes: int | None = None,
) -> tuple[DatasetSplit, DatasetSplit]:
    """Split a map-style dataset into index subsets with the permutation :func:`.workload.split_samples` draws.

    Nothing is read but item 0 (the shapes and dtypes every item must have) and nothing is standardised: the
    dataset's own transforms normalise.

    Raises:
        OrchestratorError: item 0 is not an ``(input, label)`` pair.
    """
    n = len(dataset)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_eval = eval_count(n, eval_fraction)
    spec = item_spec(dataset, num_classes)

    def part(idx: torch.Tensor) -> DatasetSplit:
        return DatasetSplit(dataset, idx.sort().values, spec, dtype, workers)

    return part(order[n_eval:]), part(order[:n_eval])


def split_data(
    data: Data,
    eval_fraction: float,
    seed: int,
    dtype: torch.dtype,
    *,
    workers: int = 0,
    num_classes: int | None = None,
    eval_data: Data | None = None,
) -> tuple[Part, Part]:
    """The training and evaluation parts: :func:`.workload.split_samples` for samples in memory (standardised
    as before), :func:`split_dataset` for a map-style dataset, or, with the user's ``eval_data``,
    :func:`own_eval_parts`."""
    if eval_data is not None:
        return own_eval_parts(data, eval_data, dtype, workers=workers, num_classes=num_classes)
    if is_samples(data):
        return split_samples(data, eval_fraction, seed, dtype)
    return split_dataset(data, eval_fraction, seed, dtype, workers=workers, num_classes=num_classes)


def own_eval_parts(
    data: Data, eval_data: Data, dtype: torch.dtype, *, workers: int = 0, num_classes: int | None = None
) -> tuple[Part, Part]:
    """All of ``data`` to train on and all of the user's ``eval_data`` to evaluate on; nothing is held out.

    Samples in memory are both standardised with the training data's mean and standard deviation
    (:func:`.workload.own_eval_samples`); datasets are read as they are (their transforms normalise).

    Raises:
        ConfigError: the two are not of the same kind (samples in memory, or map-style datasets).
    """
    if is_samples(data) and is_samples(eval_data):
        return own_eval_samples(data, eval_data, dtype)
    if is_samples(data) or is_samples(eval_data):
        kinds = ["samples in memory" if is_samples(d) else "a map-style dataset" for d in (data, eval_data)]
        raise ConfigError(f"the evaluation data is {kinds[1]} but the training data is {kinds[0]}; expected the same")

    def whole(dataset: MapDataset) -> DatasetSplit:
        spec = item_spec(dataset, num_classes)
        return DatasetSplit(dataset, torch.arange(len(dataset)), spec, dtype, workers)

    return whole(data), whole(eval_data)
