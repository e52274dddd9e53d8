"""What is trained on: samples held in memory or a map-style dataset, the split of samples in memory into their
training and evaluation parts (:class:`Split`), and the default loss.

Built-in models and datasets are looked up by name in :mod:`elastic_pipe.orchestrator.components`; a dataset's
parts, and :func:`~elastic_pipe.orchestrator.data.dataset_split.split_data`, which makes the parts of either kind,
are :mod:`elastic_pipe.orchestrator.data.dataset_split`; how a rank reads the parts is
:mod:`elastic_pipe.orchestrator.data.step_data`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

import torch
import torch.nn.functional as F

from elastic_pipe.orchestrator.data.step_data import Batch, MapDataset
from elastic_pipe.orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = [
    "Loss",
    "Samples",
    "Split",
    "Standardization",
    "as_data",
    "cross_entropy",
    "eval_count",
    "is_samples",
    "num_samples",
    "split_samples",
]

#: ``loss(output, target)``: a mean over the micro-batch.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Samples(Protocol):
    """A dataset held in memory: inputs, labels and a stable id per sample (what the cache keys on)."""

    @property
    def inputs(self) -> torch.Tensor: ...

    @property
    def labels(self) -> torch.Tensor: ...

    @property
    def sample_ids(self) -> torch.Tensor: ...


#: What the trainer trains on: samples held in memory, or a map-style dataset read item by item.
Data: TypeAlias = Samples | MapDataset

#: Floor of the standard deviation used to standardise inputs (a constant image would divide by zero).
_MIN_STD = 1e-8


@dataclass(frozen=True)
class Standardization:
    """How floating inputs held in memory were standardised: ``(x - mean) / std`` in float64, then cast.

    An exported model carries it (:mod:`elastic_pipe.orchestrator.persist.exported`), so that raw inputs reach it as
    they reached it in training.

    Attributes:
        mean: the training part's mean, over every input value.
        std: the training part's standard deviation (at least ``1e-8``).
    """

    mean: float
    std: float

    @classmethod
    def of(cls, inputs: torch.Tensor) -> Standardization:
        """The mean and standard deviation of ``inputs`` (computed in float64)."""
        x = inputs.double()
        return cls(float(x.mean()), float(x.std().clamp_min(_MIN_STD)))

    def apply(self, inputs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``inputs`` standardised and cast to ``dtype``: the same bits wherever it runs."""
        return ((inputs.double() - self.mean) / self.std).to(dtype)


@dataclass(frozen=True)
class Split:
    """A subset of a dataset held in memory (train or eval part).

    Attributes:
        inputs: the inputs, standardised when :func:`split_samples` made the split.
        labels: the labels.
        sample_ids: a stable id per sample.
        standardization: how :func:`split_samples` standardised ``inputs`` (``None``: they are as given).
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    sample_ids: torch.Tensor
    standardization: Standardization | None = None

    def __post_init__(self) -> None:
        n = self.inputs.shape[0]
        if self.labels.shape[0] != n or self.sample_ids.shape[0] != n:
            raise ConfigError(
                f"dataset tensors disagree on the number of samples: inputs {n}, labels {self.labels.shape[0]}, "
                f"sample_ids {self.sample_ids.shape[0]}"
            )

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def input_rows(self, start: int, stop: int) -> torch.Tensor:
        """Inputs ``start:stop`` (a view, where the split lives)."""
        return self.inputs[start:stop]

    def batches(
        self, index_lists: Iterable[Sequence[int]], *, inputs: bool, labels: bool, device: torch.device
    ) -> Iterator[Batch]:
        """One batch per list of positions, indexed where the split lives: on the host (then copied), or on the
        device when the caller put it there (a pinned index copies without waiting for the queued work)."""
        data_device = self.inputs.device
        for positions in index_lists:
            host_idx = torch.tensor(positions, dtype=torch.long)
            idx = host_idx
            if data_device.type == "cuda":
                idx = host_idx.pin_memory().to(data_device, non_blocking=True)
            x = self.inputs[idx].to(device, non_blocking=True) if inputs else None
            y = self.labels[idx].to(device, non_blocking=True) if labels else None
            yield Batch(host_idx, x, y)


def is_samples(data: object) -> TypeIs[Samples]:
    """Whether ``data`` is held in memory as tensors (``inputs``, ``labels``, ``sample_ids``)."""
    return all(hasattr(data, name) for name in ("inputs", "labels", "sample_ids"))


def num_samples(data: Data) -> int:
    """How many samples ``data`` (samples held in memory, or a dataset) holds."""
    return int(data.inputs.shape[0]) if is_samples(data) else len(data)


def as_data(data: object) -> Data:
    """``data`` as the trainer takes it: samples held in memory as they are, or a map-style dataset, not read.

    Raises:
        ConfigError: neither samples nor a non-empty object with ``__len__`` and ``__getitem__``.
    """
    if is_samples(data):
        return data
    if not _is_dataset(data):
        raise ConfigError(f"{type(data).__name__} is neither samples (inputs, labels, sample_ids) nor a dataset")
    if len(data) == 0:
        raise ConfigError("the dataset is empty")
    return data


def _is_dataset(data: object) -> TypeIs[MapDataset]:
    """Whether ``data`` has ``__len__`` and ``__getitem__``."""
    return hasattr(data, "__len__") and hasattr(data, "__getitem__")


def eval_count(n: int, eval_fraction: float) -> int:
    """How many of ``n`` samples :func:`split_samples` holds out for evaluation (at least one)."""
    return max(1, round(n * eval_fraction))


def split_samples(samples: Samples, eval_fraction: float, seed: int, dtype: torch.dtype) -> tuple[Split, Split]:
    """Split into a training and an evaluation part with a seeded permutation (same on every rank).

    Floating inputs are cast to ``dtype`` and standardised with the training part's mean and standard deviation
    (a transformer initialised with small weights barely sees raw [0, 1] pixels); integer inputs (token ids) are
    left alone. Both parts record the standardisation (:class:`Standardization`).
    """
    n = int(samples.inputs.shape[0])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_eval = eval_count(n, eval_fraction)
    inputs = samples.inputs
    standardization = None
    if inputs.is_floating_point():
        standardization = Standardization.of(inputs[order[n_eval:]])
        inputs = standardization.apply(inputs, dtype)

    def part(idx: torch.Tensor) -> Split:
        idx = idx.sort().values
        return Split(inputs[idx], samples.labels[idx], samples.sample_ids[idx], standardization)

    return part(order[n_eval:]), part(order[:n_eval])


def own_eval_samples(data: Samples, eval_data: Samples, dtype: torch.dtype) -> tuple[Split, Split]:
    """All of ``data`` to train on and all of the user's ``eval_data`` to evaluate on, both standardised with the
    training data's mean and standard deviation (as :func:`split_samples` does)."""
    inputs, eval_inputs = data.inputs, eval_data.inputs
    if inputs.is_floating_point():
        train = inputs.double()
        mean, std = train.mean(), train.std().clamp_min(_MIN_STD)
        inputs = ((train - mean) / std).to(dtype)
        eval_inputs = ((eval_inputs.double() - mean) / std).to(dtype)
    return Split(inputs, data.labels, data.sample_ids), Split(eval_inputs, eval_data.labels, eval_data.sample_ids)


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy for classification logits ``(B, C)`` or per-token logits ``(B, T, V)``."""
    # Low-precision logits (bf16 autocast) are upcast: the softmax over a vocabulary loses too much in bf16.
    if output.dtype in (torch.bfloat16, torch.float16):
        output = output.float()
    if output.dim() == 3:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)
