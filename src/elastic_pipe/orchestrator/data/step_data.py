"""What a rank reads: the training and evaluation parts of the data, one interface (:class:`StepData`) for two kinds.

* :class:`~elastic_pipe.orchestrator.data.workload.Split`: tensors held in memory, indexed directly (the fast path
  of the built-in datasets);
* :class:`~elastic_pipe.orchestrator.data.dataset_split.DatasetSplit`: an index subset of any map-style dataset
  (``__len__`` and ``__getitem__`` returning ``(input, label)``, e.g. a ``torch.utils.data.Dataset``), read through a
  ``torch.utils.data.DataLoader`` with ``[data] workers`` worker processes; nothing is stacked into memory. Its
  loaders persist across epochs (:mod:`~elastic_pipe.orchestrator.data.loader_pool`: one per way of reading it,
  rebuilt when the sampler re-shards), and a step that needs only labels (every sample's prefix output cached) reads
  them from the dataset's ``targets`` or ``labels`` when it has them
  (:func:`~elastic_pipe.orchestrator.data.items.label_table`), decoding nothing. Its items are checked, read and
  stacked by :mod:`~elastic_pipe.orchestrator.data.items`.

Either way a step's indices come from the :class:`~elastic_pipe.data.ElasticSampler` through
:class:`~elastic_pipe.orchestrator.data.epoch_steps.ElasticBatchSampler`;
:mod:`~elastic_pipe.orchestrator.data.epoch_steps` cuts the epoch into steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import torch

__all__ = ["Batch", "StepData"]  # MapDataset: for the modules beside it


class MapDataset(Protocol):
    """A map-style dataset: ``dataset[i]`` is item ``i``, an ``(input, label)`` pair (a ``torch.utils.data.Dataset``
    with a length, say)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> object: ...


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
