"""The transition carry (``ActivationCache.extend``) of a slab: consecutive slots are moved through views of the
slab (on a pinned host slab and a GPU: DMA both ways, one synchronisation), scattered ones through a gather and a
scatter; either way every entry carried holds ``fn`` of its old value and the others keep their slots."""

from __future__ import annotations

import pytest
import torch

from elastic_pipe.cache import ActivationCache, CacheTiers
from elastic_pipe.cache.segments import _run_of

WIDTH = 6


def _rows(ids: torch.Tensor) -> torch.Tensor:
    return ids.double()[:, None] * 10.0 + torch.arange(WIDTH, dtype=torch.float64)


def test_a_run_of_slots_is_found_only_when_consecutive() -> None:
    assert _run_of(torch.tensor([4, 5, 6])) == (4, 7)
    assert _run_of(torch.tensor([9])) == (9, 10)
    assert _run_of(torch.tensor([4, 6, 6])) is None  # right ends, a gap inside
    assert _run_of(torch.tensor([4, 6])) is None
    assert _run_of(torch.tensor([], dtype=torch.int64)) is None
    assert _run_of(torch.tensor([-1, 0])) is None


def test_a_carry_of_consecutive_and_scattered_slots_moves_every_value() -> None:
    n = 24
    cache = ActivationCache(n, device_budget=n * WIDTH * 8, device="cpu")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    for lo in range(0, n, 5):  # slots follow the order of the puts
        cache.put(order[lo : lo + 5], 1, _rows(order[lo : lo + 5]))
    mine = torch.cat([order[:9], order[[12, 15, 20]]])  # slots 0..8 (runs of 4, 4, 1), then 12, 15, 20
    assert cache.extend(1, 2, lambda v: v * 2 - 1, batch_size=4, only=mine) == 12
    got = cache.get(mine, 2)
    assert got.num_hits == 12 and torch.equal(got.values, _rows(mine) * 2 - 1)
    others = order[~torch.isin(order, mine)]
    assert cache.get(others, 2).num_hits == 0  # not carried: their slots wait for their put
    cache.put(others, 2, _rows(others))
    assert torch.equal(cache.get(order, 2).values[~torch.isin(order, mine)], _rows(others))
    assert cache.extend(2, 3, lambda v: v + 1, batch_size=7) == n  # every slot, in runs of 7
    assert torch.equal(cache.get(mine, 3).values, _rows(mine) * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_pinned_host_slab_is_carried_on_the_gpu() -> None:
    cuda = torch.device("cuda")
    n, entry = 64, WIDTH * 8
    cache = ActivationCache.from_tiers(n, CacheTiers(8 * entry, n * entry, host_kind="pinned"), device=cuda)
    ids = torch.arange(n)
    for lo in range(0, n, 16):
        cache.put(ids[lo : lo + 16], 1, _rows(ids[lo : lo + 16]).to(cuda))
    assert [t.entries for t in cache.stats.tiers][:2] == [8, 56]
    assert cache.extend(1, 2, lambda v: v * 3, batch_size=16) == n
    assert torch.equal(cache.get(ids, 2).values.cpu(), _rows(ids) * 3)
    mine = torch.cat([ids[8:30], ids[33:60:3]])  # host slots in runs and scattered
    assert cache.extend(2, 3, lambda v: v - 1, batch_size=8, only=mine) == mine.numel()
    assert torch.equal(cache.get(mine, 3).values.cpu(), _rows(mine) * 3 - 1)
    cache.unlink()
