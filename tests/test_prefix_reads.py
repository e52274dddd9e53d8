"""A step's prefix output through the cache (``read_prefix``): a batch with any miss runs the prefix whole, at its
own size, and stores its misses; the hits come from the cache; a batch with nothing cached runs as it is (no masked
copy of its inputs)."""

from __future__ import annotations

import torch

from elastic_pipe.cache import ActivationCache
from elastic_pipe.orchestrator.prefix.reads import read_prefix


def _prefix(seen: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    def run(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x * 2 + 1

    return run


def test_a_batch_with_nothing_cached_runs_as_it_is_and_is_stored() -> None:
    cache = ActivationCache(10, device_budget=1 << 16)
    ids, x = torch.tensor([3, 1, 7]), torch.randn(3, 4)
    seen: list[torch.Tensor] = []
    out = read_prefix(cache, None, ids, x, frozen=2, run_prefix=_prefix(seen))
    assert len(seen) == 1 and seen[0] is x
    assert torch.equal(out, x * 2 + 1)
    assert torch.equal(cache.get(ids, 2).values, x * 2 + 1)


def test_a_batch_with_a_miss_runs_whole_stores_its_misses_and_reads_its_hits() -> None:
    cache = ActivationCache(10, device_budget=1 << 16)
    ids, x = torch.tensor([3, 1, 7, 5]), torch.randn(4, 4)
    stored = torch.full((2, 4), 7.0)  # not what the prefix gives: the hits must come from the cache
    cache.put(ids[[1, 3]], 2, stored)
    seen: list[torch.Tensor] = []
    out = read_prefix(cache, None, ids, x, frozen=2, run_prefix=_prefix(seen))
    assert [v.shape[0] for v in seen] == [4] and seen[0] is x  # one forward, at the batch's size
    assert torch.equal(out[[0, 2]], x[[0, 2]] * 2 + 1)
    assert torch.equal(out[[1, 3]], stored)
    assert cache.get(ids, 2).num_hits == 4
    assert torch.equal(cache.get(ids[[1, 3]], 2).values, stored)  # a hit keeps its entry


def test_a_step_without_inputs_runs_only_the_misses_it_reads() -> None:
    cache = ActivationCache(10, device_budget=1 << 16)
    ids, x = torch.tensor([3, 1, 7, 5]), torch.randn(10, 4)
    cache.put(ids[[0, 2, 3]], 2, x[ids[[0, 2, 3]]] * 2 + 1)
    seen: list[torch.Tensor] = []
    read: list[torch.Tensor] = []

    def read_inputs(missing: torch.Tensor) -> torch.Tensor:
        read.append(missing)
        return x[missing]

    out = read_prefix(cache, None, ids, None, frozen=2, run_prefix=_prefix(seen), read_inputs=read_inputs)
    assert [r.tolist() for r in read] == [[1]] and [v.shape[0] for v in seen] == [1]
    assert torch.equal(out, x[ids] * 2 + 1)
