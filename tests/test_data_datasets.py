"""Bundled datasets: shapes, scaling, stable sample ids, splits, and the missing-extra error."""

from __future__ import annotations

import sys

import pytest
import torch

from elastic_pipe.data import DATASETS, DataError, IndexedDataset, MissingExtraError, load_dataset, load_digits


def test_digits() -> None:
    d = load_digits()
    assert len(d) == 1797 and d.inputs.shape == (1797, 1, 8, 8) and d.inputs.dtype == torch.float32
    assert float(d.inputs.min()) == 0.0 and float(d.inputs.max()) == 1.0
    assert torch.equal(d.sample_ids, torch.arange(1797)) and d.num_ids == 1797
    assert d.labels[:10].tolist() == list(range(10)) and d.num_classes == 10
    x, y, i = d[5]
    assert x.shape == (1, 8, 8) and int(y) == 5 and int(i) == 5


def test_mnist5k() -> None:
    m = load_dataset("mnist5k")
    assert m.inputs.shape == (5000, 1, 28, 28) and m.labels.shape == (5000,)
    assert float(m.inputs.max()) == 1.0 and float(m.inputs.min()) == 0.0
    assert sorted(torch.unique(m.labels).tolist()) == list(range(10))
    assert torch.equal(m.sample_ids, torch.arange(5000))


def test_split_and_subset_keep_ids() -> None:
    d = load_digits()
    train, test = d.split(0.25, seed=1)
    assert (len(train), len(test)) == (1348, 449)
    ids = torch.cat([train.sample_ids, test.sample_ids]).sort().values
    assert torch.equal(ids, torch.arange(1797))
    assert torch.equal(train.inputs[3], d.inputs[int(train.sample_ids[3])])
    assert train.num_ids <= 1797
    again, _ = d.split(0.25, seed=1)
    assert torch.equal(again.sample_ids, train.sample_ids)
    sub = d.subset([7, 2])
    assert sub.sample_ids.tolist() == [7, 2] and sub.labels.tolist() == [7, 2]


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(MissingExtraError, match=r"elastic-pipe\[datasets\]") as info:
        load_digits()
    assert isinstance(info.value, ImportError) and isinstance(info.value, DataError)


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(DataError, match="unknown dataset 'cifar'; expected one of: digits, mnist5k"):
        load_dataset("cifar")
    assert sorted(DATASETS) == ["digits", "mnist5k"]


def test_validation() -> None:
    x, y = torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(DataError, match="distinct"):
        IndexedDataset("t", x, y, torch.tensor([1, 1]), 2)
    with pytest.raises(DataError, match="labels"):
        IndexedDataset("t", x, y.float(), torch.tensor([0, 1]), 2)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="inputs"):
        IndexedDataset("t", torch.zeros(2, 4), y, torch.tensor([0, 1]), 2)
