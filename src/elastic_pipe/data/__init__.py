"""Elastic data: a deterministic distributed sampler that re-shards mid-epoch without losing or repeating a sample,
and real datasets that ship inside PyPI packages (digits, MNIST 5k) with sample ids.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.data.datasets import DATASETS, IndexedDataset, load_dataset, load_digits, load_mnist5k
from elastic_pipe.data.errors import DataError, MissingExtraError
from elastic_pipe.data.sampler import ElasticSampler

__all__ = [
    "DATASETS",
    "DataError",
    "ElasticSampler",
    "IndexedDataset",
    "MissingExtraError",
    "load_dataset",
    "load_digits",
    "load_mnist5k",
]
