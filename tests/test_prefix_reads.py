"""A step's prefix output through the cache (``read_prefix``): the misses alone run the prefix and are stored; a
batch with nothing cached runs as it is (no masked copy of its inputs)."""

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


def test_only_the_misses_run_and_the_batch_keeps_its_order() -> None:
    cache = ActivationCache(10, device_budget=1 << 16)
    ids, x = torch.tensor([3, 1, 7, 5]), torch.randn(4, 4)
    cache.put(ids[[1, 3]], 2, x[[1, 3]] * 2 + 1)
    seen: list[torch.Tensor] = []
    out = read_prefix(cache, None, ids, x, frozen=2, run_prefix=_prefix(seen))
    assert len(seen) == 1 and torch.equal(seen[0], x[[0, 2]])
    assert torch.equal(out, x * 2 + 1)
    assert cache.get(ids, 2).num_hits == 4
