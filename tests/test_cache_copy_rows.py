"""The pinned host tier's read: rows copied one run of consecutive slots at a time (``copy_rows``) are exactly the
gather's rows, in batch order, with one copy per run; and since a GPU then reads the slab's slots by DMA on the
prefetch stream, the cache waits for those copies before it rewrites entries in place or frees them."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.cache import ActivationCache
from elastic_pipe.cache.segments import copy_rows


def _runs(order: list[int]) -> int:
    return sum(1 for i, s in enumerate(order) if i == 0 or s != order[i - 1] + 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 19), max_size=30))
def test_copied_rows_are_the_gathered_rows_one_copy_per_run(order: list[int]) -> None:
    data = torch.arange(20 * 6, dtype=torch.float32).reshape(20, 2, 3)
    slots = torch.tensor(order, dtype=torch.int64)
    out = torch.full((len(order), 2, 3), -1.0)
    copies = copy_rows(data, slots, out)
    assert torch.equal(out, data.index_select(0, slots))
    assert copies == _runs(order)


def test_a_run_of_consecutive_slots_is_one_copy_and_a_repeat_starts_a_new_one() -> None:
    data = torch.randn(10, 4)
    out = torch.empty(7, 4)
    assert copy_rows(data, torch.tensor([2, 3, 4, 8, 8, 0, 1]), out) == 4
    assert torch.equal(out, data[[2, 3, 4, 8, 8, 0, 1]])


class _SideStream:
    """Stands in for the cache's prefetch stream on the CPU: counts the waits for its copies."""

    def __init__(self) -> None:
        self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1


def test_lookups_started_ahead_are_waited_for_before_entries_are_rewritten_or_freed() -> None:
    cache = ActivationCache(8, device_budget=1 << 16)
    ids = torch.arange(8)
    cache.put(ids, 1, torch.randn(8, 4))
    side = _SideStream()
    cache._side_stream = side  # type: ignore[assignment]  # what prefetch sets up on a GPU
    cache.get(ids, 1)
    assert side.waits == 0  # reads and writes of fresh slots need no wait
    cache.extend(1, 2, lambda v: v * 2)  # rewrites the slots in place
    assert side.waits == 1
    cache.drop(2)
    assert side.waits == 2
    cache.close()
    assert side.waits == 3


def _keep_busy(cycles: int = 1 << 31) -> float:
    """Time ``cycles`` of device sleep, then queue as many again (the device is busy on return); the seconds."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    busy_s = time.perf_counter() - t0
    torch.cuda._sleep(cycles)
    return busy_s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_lookup_over_two_tiers_is_issued_without_waiting_for_the_device() -> None:
    """A batch served partly by the device tier and partly by the pinned host tier: the two tiers' rows are put in
    batch order through an index in pinned memory, so starting the lookup returns while the device is still busy
    (a pageable index held the host until the stream's queued copies had run: a step's whole read, every step)."""
    device = torch.device("cuda")
    row = 1024
    cache = ActivationCache(16, device_budget=8 * row * 4, host_budget=16 * row * 4, host_kind="pinned", device=device)
    values = torch.randn(16, row, device=device)
    cache.put(torch.arange(16), 3, values)
    assert [t.entries for t in cache.stats.tiers] == [8, 8]
    ids = torch.tensor([12, 0, 9, 3, 15, 7, 8, 1])  # both tiers, interleaved
    cache.prefetch(ids, 3).result()  # the first call's set-up (the side stream, the pinned index) out of the timing
    busy_s = _keep_busy()  # the device busy again; the side stream waits for it before its copies
    t0 = time.perf_counter()
    pending = cache.prefetch(ids, 3)
    issue_s = time.perf_counter() - t0
    lookup = pending.result()
    torch.cuda.synchronize()
    assert issue_s < busy_s / 4, (issue_s, busy_s)
    assert bool(lookup.hit.all()) and torch.equal(lookup.values, values[ids.to(device)])
    cache.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_fill_into_the_pinned_host_tier_does_not_hold_the_host() -> None:
    """Fresh consecutive slots of the pinned host slab are written by a DMA queued on the current stream: the put
    returns while the device is busy, and every later reader (a lookup, a move of the boundary, a read to the
    host) sees the rows."""
    device = torch.device("cuda")
    row = 1024
    cache = ActivationCache(16, host_budget=32 * row * 4, host_kind="pinned", device=device)  # room to spare
    values = torch.randn(16, row, device=device)
    cache.put(torch.arange(2), 1, values[:2])  # the slab's allocation out of the timing
    rest = values[2:].clone()  # allocated first: a new device block could wait for the device itself
    busy_s = _keep_busy()  # the copies queue behind the sleep: a blocking copy would wait for it
    t0 = time.perf_counter()
    stored = cache.put(torch.arange(2, 16), 1, rest)
    issue_s = time.perf_counter() - t0
    assert stored == 14
    assert issue_s < busy_s / 4, (issue_s, busy_s)
    ids = torch.tensor([15, 3, 0, 9])
    assert torch.equal(cache.get(ids, 1).values, values[ids.to(device)])
    cache.drop(1)
    _keep_busy()
    assert cache.put(torch.arange(2, 16), 2, values[2:] * 3) == 14  # another boundary, behind another sleep
    cache.extend(2, 3, lambda v: v + 1)  # a move over the slab: it reads the rows just written
    assert torch.equal(cache.get(ids[:2], 3).values, values[ids[:2].to(device)] * 3 + 1)
    cache.close()
