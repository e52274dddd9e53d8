"""Elastic data: a deterministic distributed sampler that re-shards mid-epoch without losing or repeating a sample,
and real datasets that ship inside PyPI packages (digits, MNIST 5k) with sample ids, and a text corpus (BBC News)
as texts and labels with a fixed split.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.data.datasets import DATASETS, IndexedDataset, load_dataset, load_digits, load_mnist5k
from elastic_pipe.data.errors import DataError, DataTypeError, MissingExtraError
from elastic_pipe.data.sampler import ElasticSampler
from elastic_pipe.data.text import BBC_CLASSES, TEXT_CORPORA, TextCorpus, load_bbcnews, load_text_corpus

__all__ = [
    "BBC_CLASSES",
    "DATASETS",
    "TEXT_CORPORA",
    "DataError",
    "DataTypeError",
    "ElasticSampler",
    "IndexedDataset",
    "MissingExtraError",
    "TextCorpus",
    "load_bbcnews",
    "load_dataset",
    "load_digits",
    "load_mnist5k",
    "load_text_corpus",
]
