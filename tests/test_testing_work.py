"""``elastic_pipe.testing.count_work``: what it counts, in one process (the copies between ranks are checked exactly
by ``tests/test_transition_work.py``, whose expected bytes come from the layouts)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import cache as acache
from elastic_pipe.testing import CountedDataset, count_work


class _Items:
    def __init__(self, n: int) -> None:
        self.x = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)
        self.random_augmentation = False

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> Any:
        return self.x[i], 0


def test_count_work_counts_forwards_rows_cache_writes_reads_parts_and_calls() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))
    data = CountedDataset(_Items(10))
    cache = acache.ActivationCache(10, device_budget=1 << 20)
    ids = torch.arange(10)
    helper = types.SimpleNamespace(build=lambda n: n + 1)
    model(torch.zeros(2, 4))  # outside the block: not counted
    broadcast = dist.broadcast
    with count_work(model, cache=cache, dataset=data, calls={"built": (helper, "build")}) as work:
        x = torch.stack([data[i][0] for i in range(6)])  # 6 items read
        h = model[0](x)  # sub-layer 0: one call of 6 rows
        assert cache.put(ids[:6], 1, h) == 6  # 6 entries of 4 float32
        assert cache.put(ids[:6], 1, h) == 0  # already cached: nothing written
        cache.extend(1, 2, model[1])  # sub-layer 1 carries the 6 entries in place
        cache.get(ids[:3], 2)
        assert helper.build(1) == 2
        with work.part("probe"):
            model(torch.zeros(5, 4))  # every sub-layer once, 5 rows, in its own part
            _ = data[0]
    main, probe = work.total, work["probe"]
    assert (main.calls, main.rows) == ([1, 1, 0], [6, 6, 0])
    assert (main.cache_put, main.cache_put_bytes) == (6, 6 * 4 * 4)
    assert (main.cache_carried, main.cache_carried_bytes) == (6, 6 * 4 * 4)
    assert (main.cache_got, main.items_read, dict(main.called)) == (3, 6, {"built": 1})
    assert (probe.calls, probe.rows, probe.items_read, probe.cache_put) == ([1, 1, 1], [5, 5, 5], 1, 0)
    assert work["nothing"].calls == [0, 0, 0] and data.reads == 7
    # everything is put back: hooks, the cache's methods, the named function, the dataset's counter
    model(torch.zeros(1, 4))
    assert main.calls == [1, 1, 0] and "put" not in vars(cache) and helper.build(1) == 2
    assert dict(main.called) == {"built": 1} and data.work is None
    assert dist.broadcast is broadcast
    assert work.to_dict()["main"]["rows"] == [6, 6, 0]


def test_count_work_puts_everything_back_when_the_block_raises() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    send = dist.send
    with pytest.raises(RuntimeError, match="boom"), count_work(model) as work:
        model(torch.zeros(3, 2))
        raise RuntimeError("boom")
    model(torch.zeros(3, 2))
    assert work.total.rows == [3] and dist.send is send
