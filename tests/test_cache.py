"""ActivationCache: hits and misses, bit-identical values, budgets and spilling, boundary moves, corruption,
augmentation policies, and the pay-off decision."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from elastic_pipe.cache import (
    ActivationCache,
    CacheError,
    decide,
    measure_payoff,
    payoff_threshold,
    time_call,
)
from elastic_pipe.cache.layout import SegmentLayout

WIDTH = 8
ENTRY = WIDTH * 4  # bytes of one float32 row


def rows(ids: torch.Tensor) -> torch.Tensor:
    """Deterministic, distinct per-sample values."""
    return ids.float()[:, None] * 100 + torch.arange(WIDTH, dtype=torch.float32)


def file_budget(entries: int, num_keys: int, *, checksum: bool = False, width: int = WIDTH) -> int:
    """Bytes of a segment file holding exactly ``entries`` float32 rows of ``width``."""
    return SegmentLayout((width,), torch.float32, entries, num_keys, checksum).file_bytes


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield tmp_path / "shm", tmp_path / "disk"


def make(dirs: tuple[Path, Path], num_samples: int = 100, **kw: object) -> ActivationCache:
    host, disk = dirs
    return ActivationCache(num_samples, host_dir=host, disk_dir=disk, **kw)  # type: ignore[arg-type]


def test_prefetch_on_cpu_is_an_immediate_get(dirs: tuple[Path, Path]) -> None:
    cache = make(dirs, device_budget=1 << 20)
    cache.put(torch.arange(4), 1, rows(torch.arange(4)))
    lookup = cache.prefetch(torch.tensor([3, 9, 0]), 1).result()
    assert lookup.hit.tolist() == [True, False, True]
    assert torch.equal(lookup.values, rows(torch.tensor([3, 0])))
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)


def test_hit_and_miss_counts(dirs: tuple[Path, Path]) -> None:
    cache = make(dirs, device_budget=1 << 20)
    assert cache.put(torch.arange(10), 3, rows(torch.arange(10))) == 10
    lookup = cache.get(torch.arange(5, 15), 3)
    assert lookup.hit.tolist() == [True] * 5 + [False] * 5
    assert torch.equal(lookup.values, rows(torch.arange(5, 10)))
    assert lookup.missing_ids.tolist() == list(range(10, 15))
    assert cache.get(torch.arange(3), 2).num_hits == 0  # another boundary is another key
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.stored, stats.rejected) == (5, 8, 10, 0)
    assert cache.put(torch.tensor([1, 2, 2, 50]), 3, rows(torch.tensor([1, 2, 2, 50]))) == 1  # only id 50 is new


TIERS = {
    "device": {"device_budget": 1 << 20},
    "host": {"host_budget": 1 << 20},
    "disk": {"disk_budget": 1 << 20},
    "spread": {"device_budget": 7 * 4 * ENTRY, "host_budget": file_budget(11, 64, width=4 * WIDTH)},
}


@pytest.mark.parametrize("tiers", TIERS.values(), ids=TIERS.keys())
def test_cached_values_are_bit_identical_to_recomputation(dirs: tuple[Path, Path], tiers: dict[str, int]) -> None:
    torch.manual_seed(0)
    # Row-wise (no matmul): a CPU matmul's last bits can depend on how many rows are in the batch, and the misses
    # are computed as a sub-batch, so a BLAS prefix would differ from the full-batch reference for reasons
    # unrelated to the cache.
    weight = torch.randn(4 * WIDTH)

    def prefix(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x.flatten(1).repeat(1, 2) * weight).sin() + 0.5

    inputs = torch.randn(64, 4, 4)
    cache = make(dirs, 64, **tiers)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):  # epochs: first misses, then hits
        for batch in torch.randperm(64, generator=generator).split(16):
            got = cache.get_or_compute(batch, 2, inputs[batch], prefix)
            with torch.no_grad():
                assert torch.equal(got, prefix(inputs[batch]))
    stats = cache.stats
    cached = 18 if "host_budget" in tiers and "device_budget" in tiers else 64  # "spread" holds 7 + 11
    assert (stats.stored, stats.hits, stats.misses) == (cached, 2 * cached, 64 + 2 * (64 - cached))
    assert stats.rejected == 3 * (64 - cached)  # every epoch tries to store what does not fit
    cache.unlink()


def test_budgets_respected_and_spill_in_order(dirs: tuple[Path, Path]) -> None:
    num = 100
    cache = make(
        dirs,
        num,
        device_budget=10 * ENTRY + ENTRY - 1,
        host_budget=file_budget(20, num),
        disk_budget=file_budget(30, num, checksum=True),
    )
    ids = torch.randperm(num, generator=torch.Generator().manual_seed(3))
    assert cache.put(ids, 4, rows(ids)) == 60
    stats = cache.stats
    assert stats.rejected == 40
    assert [(t.name, t.entries) for t in stats.tiers] == [("device", 10), ("host", 20), ("disk", 30)]
    for tier in stats.tiers:
        assert tier.used_bytes <= tier.budget_bytes
    host_file, disk_file = dirs[0] / f"{cache.config.name}.b4.slab", dirs[1] / f"{cache.config.name}.b4.slab"
    assert host_file.stat().st_size <= stats.tiers[1].budget_bytes
    assert disk_file.stat().st_size <= stats.tiers[2].budget_bytes
    # the first 10 ids went to the device, the next 20 to host, the next 30 to disk
    query = ids.flip(0)  # a batch in another order, spanning every tier and the misses
    lookup = cache.get(query, 4)
    assert lookup.hit.tolist() == [False] * 40 + [True] * 60
    assert torch.equal(lookup.values, rows(query[lookup.hit]))
    assert [t.hits for t in cache.stats.tiers] == [10, 20, 30]
    cache.unlink()


def test_extend_runs_only_the_new_layers_on_cached_values(dirs: tuple[Path, Path]) -> None:
    num = 40
    cache = make(dirs, num, device_budget=5 * ENTRY, host_budget=file_budget(10, num), disk_budget=1 << 20)
    ids = torch.arange(num)
    cache.put(ids, 2, rows(ids))
    seen: list[int] = []

    def layers_2_to_5(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return x * 3 - 1

    assert cache.extend(2, 5, layers_2_to_5, batch_size=8) == num
    assert sum(seen) == num and max(seen) <= 8  # every entry once, in chunks, nothing recomputed from inputs
    assert cache.boundaries() == [5]
    assert cache.get(ids, 2).num_hits == 0
    lookup = cache.get(ids, 5)
    assert lookup.num_hits == num and torch.equal(lookup.values, rows(ids) * 3 - 1)
    assert [t.entries for t in cache.stats.tiers] == [5, 10, 25]
    assert not (dirs[0] / f"{cache.config.name}.b2.slab").exists()
    cache.unlink()


def test_extend_with_a_new_shape_restores_through_put(dirs: tuple[Path, Path]) -> None:
    cache = make(dirs, 20, device_budget=1 << 20)
    ids = torch.arange(20)
    cache.put(ids, 1, rows(ids))
    assert cache.extend(1, 2, lambda x: x[:, :3].to(torch.float64)) == 20
    lookup = cache.get(ids, 2)
    assert lookup.num_hits == 20 and torch.equal(lookup.values, rows(ids)[:, :3].double())
    assert cache.boundaries() == [2] and cache.stats.tiers[0].used_bytes == 20 * 3 * 8


def test_drop_returns_memory(dirs: tuple[Path, Path]) -> None:
    cache = make(dirs, 30, device_budget=10 * ENTRY, host_budget=file_budget(30, 30))
    cache.put(torch.arange(30), 6, rows(torch.arange(30)))
    host_file = dirs[0] / f"{cache.config.name}.b6.slab"
    assert host_file.exists()
    freed = cache.drop(6)
    assert freed == 10 * ENTRY + file_budget(30, 30)
    assert not host_file.exists()
    assert [t.used_bytes for t in cache.stats.tiers] == [0, 0]
    assert cache.get(torch.arange(30), 6).num_hits == 0


def _disk_cache(dirs: tuple[Path, Path], num: int = 20) -> tuple[ActivationCache, Path]:
    cache = make(dirs, num, disk_budget=1 << 20)
    cache.put(torch.arange(num), 3, rows(torch.arange(num)))
    cache.flush()
    return cache, dirs[1] / f"{cache.config.name}.b3.slab"


def _layout(path: Path) -> SegmentLayout:
    return SegmentLayout.parse(path.read_bytes()[:4096])


def test_corrupted_disk_entry_is_detected_and_recomputed(dirs: tuple[Path, Path]) -> None:
    cache, path = _disk_cache(dirs)
    layout = _layout(path)
    with path.open("r+b") as f:  # flip one byte inside entry 7 (slot 7: ids were stored in order)
        f.seek(layout.data_offset + 7 * layout.entry_bytes + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    lookup = cache.get(torch.arange(20), 3)
    assert lookup.hit.tolist() == [i != 7 for i in range(20)]
    assert torch.equal(lookup.values, rows(torch.arange(20))[torch.arange(20) != 7])
    assert cache.stats.corrupt == 1
    # recomputed on the miss, rewritten into the same slot, then served again
    full = cache.get_or_compute(torch.arange(20), 3, torch.arange(20), rows)
    assert torch.equal(full, rows(torch.arange(20)))
    assert cache.get(torch.tensor([7]), 3).num_hits == 1 and cache.stats.corrupt == 1
    cache.unlink()


def test_truncated_disk_file_is_detected_and_regrown(dirs: tuple[Path, Path]) -> None:
    cache, path = _disk_cache(dirs)
    layout = _layout(path)
    os.truncate(path, layout.data_offset + 12 * layout.entry_bytes + 3)  # entry 12 is cut, 13.. are gone
    lookup = cache.get(torch.arange(20), 3)
    assert lookup.hit.tolist() == [True] * 12 + [False] * 8
    assert cache.stats.corrupt == 8
    assert cache.put(torch.arange(20), 3, rows(torch.arange(20))) == 8
    assert path.stat().st_size == layout.file_bytes
    assert torch.equal(cache.get(torch.arange(20), 3).values, rows(torch.arange(20)))
    cache.unlink()


def test_corrupted_header_discards_the_segment(dirs: tuple[Path, Path]) -> None:
    cache, path = _disk_cache(dirs)
    cache.close()
    with path.open("r+b") as f:
        f.write(b"garbage!")
    fresh = make(dirs, 20, disk_budget=1 << 20, name=cache.config.name)
    assert fresh.get(torch.arange(20), 3).num_hits == 0
    assert not path.exists()


def test_extend_never_carries_a_corrupted_entry(dirs: tuple[Path, Path]) -> None:
    cache, path = _disk_cache(dirs)
    layout = _layout(path)
    with path.open("r+b") as f:
        f.seek(layout.data_offset + 2 * layout.entry_bytes)
        f.write(b"\x01\x02\x03\x04")
    assert cache.extend(3, 4, lambda x: x + 1) == 19
    lookup = cache.get(torch.arange(20), 4)
    assert lookup.hit.tolist() == [i != 2 for i in range(20)]
    assert torch.equal(lookup.values, rows(torch.arange(20))[torch.arange(20) != 2] + 1)
    cache.unlink()


def test_random_augmentation_policies(dirs: tuple[Path, Path]) -> None:
    with pytest.raises(CacheError, match=r"random augmentation.*'bypass'.*'views'"):
        make(dirs, device_budget=1 << 20, augmentation="random")
    bypass = make(dirs, device_budget=1 << 20, augmentation="random", on_random_augmentation="bypass")
    assert not bypass.enabled
    assert bypass.put(torch.arange(4), 1, rows(torch.arange(4))) == 0
    assert bypass.get(torch.arange(4), 1).num_hits == 0 and bypass.stats.misses == 4
    views = make(dirs, device_budget=1 << 20, augmentation="random", on_random_augmentation="views", views=2)
    ids = torch.arange(4)
    views.set_epoch(0)
    views.put(ids, 1, rows(ids))
    views.set_epoch(1)
    assert views.get(ids, 1).num_hits == 0  # epoch 1 has its own view
    views.put(ids, 1, rows(ids) + 0.5)
    views.set_epoch(2)
    assert torch.equal(views.get(ids, 1).values, rows(ids))  # epoch 2 reuses view 0
    views.set_epoch(3)
    assert torch.equal(views.get(ids, 1).values, rows(ids) + 0.5)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.get(torch.tensor([0.0]), 1), "integer tensor"),
        (lambda c: c.get(torch.tensor([[0]]), 1), "1-D"),
        (lambda c: c.get(torch.tensor([100]), 1), r"\[0, 100\), got min 100"),
        (lambda c: c.get(torch.tensor([0]), -1), "boundary must be an int >= 0"),
        (lambda c: c.put(torch.tensor([0, 1]), 1, torch.zeros(3, 2)), "one row per sample id"),
        (lambda c: c.extend(3, 3, lambda x: x), "new_boundary > old_boundary"),
        (
            lambda c: (c.put(torch.tensor([0]), 1, torch.zeros(1, 2)), c.put(torch.tensor([1]), 1, torch.zeros(1, 3))),
            r"holds entries \(2,\)",
        ),
    ],
)
def test_bad_input(dirs: tuple[Path, Path], call: object, match: str) -> None:
    cache = make(dirs, device_budget=1 << 20)
    with pytest.raises(CacheError, match=match):
        call(cache)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device_budget": -1}, "device_budget must be an int >= 0"),
        ({"disk_budget": 10, "disk_dir": None}, "needs a disk_dir"),
        ({"augmentation": "sometimes"}, "unknown augmentation 'sometimes'; expected one of: 'none', 'random'"),
        ({"views": 2}, "views=2 needs on_random_augmentation='views'"),
        ({"name": "a/b"}, "plain file-name prefix"),
    ],
)
def test_bad_config(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(CacheError, match=match):
        ActivationCache(10, **kwargs)  # type: ignore[arg-type]


def test_decide_exact() -> None:
    on = decide(0.001, 0.003)
    assert on.enabled and on.speedup == pytest.approx(3.0)
    assert on.reason == "enable cache: read 1.000 ms x margin 1 < recompute 3.000 ms"
    assert not decide(0.002, 0.002).enabled
    assert not decide(0.001, 0.003, margin=4.0).enabled
    assert decide(0.0, 0.001).speedup == float("inf")
    assert not decide(float("inf"), 5.0).enabled and decide(float("inf"), 5.0).speedup == 0.0
    with pytest.raises(CacheError, match=r"read_seconds must be a number >= 0 \(inf: unavailable\), got -1"):
        decide(-1, 1)
    with pytest.raises(CacheError, match="recompute_seconds must be a finite number"):
        decide(1, float("inf"))
    with pytest.raises(CacheError, match="margin"):
        decide(1, 1, margin=0)


def test_payoff_threshold() -> None:
    recompute = [0.0, 1.0, 2.0, 3.0, 4.0]  # seconds for 0..4 frozen layers
    assert payoff_threshold(2.5, recompute) == 3
    assert payoff_threshold([5, 5, 1.5, 0.1, 0.1], recompute) == 2
    assert payoff_threshold(10.0, recompute) is None
    with pytest.raises(CacheError, match="expected equal"):
        payoff_threshold([1.0], recompute)


def test_measure_payoff_reports_both_times_and_leaves_stats(dirs: tuple[Path, Path]) -> None:
    torch.manual_seed(0)
    prefix = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]).eval()
    cache = make(dirs, 32, device_budget=1 << 20)
    ids, inputs = torch.arange(32), torch.randn(32, 64)
    decision = measure_payoff(cache, ids, 4, inputs, prefix, repeats=3)
    assert decision.read_seconds > 0 and decision.recompute_seconds > 0
    assert decision.enabled == (decision.read_seconds < decision.recompute_seconds)
    assert (cache.stats.hits, cache.stats.misses, cache.stats.stored) == (0, 0, 32)
    tiny = make(dirs, 32, device_budget=ENTRY)
    with pytest.raises(CacheError, match="does not fit"):
        measure_payoff(tiny, ids, 4, inputs, prefix, repeats=1)


def test_time_call_counts_runs_and_checks_arguments() -> None:
    calls: list[int] = []
    assert time_call(lambda: calls.append(1), repeats=4, warmup=2, statistic="min") >= 0
    assert len(calls) == 6
    with pytest.raises(CacheError, match="unknown statistic 'mean'; expected one of: median, min"):
        time_call(lambda: None, statistic="mean")
    with pytest.raises(CacheError, match="repeats >= 1"):
        time_call(lambda: None, repeats=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_tier_and_pinned_host_reads(dirs: tuple[Path, Path]) -> None:
    cuda = torch.device("cuda")
    num = 64
    cache = make(
        dirs, num, device=cuda, device_budget=16 * ENTRY, host_budget=file_budget(16, num), disk_budget=1 << 20
    )
    ids = torch.randperm(num, generator=torch.Generator().manual_seed(0))
    cache.put(ids, 2, rows(ids).to(cuda))
    assert [t.entries for t in cache.stats.tiers] == [16, 16, 32]
    query = torch.arange(num)
    lookup = cache.get(query, 2)
    assert lookup.values.device.type == "cuda" and lookup.num_hits == num
    assert torch.equal(lookup.values.cpu(), rows(query))
    pending = cache.prefetch(query, 2)  # side-stream copies, handed over without a host sync
    assert torch.equal(pending.result().values.cpu(), rows(query))
    assert cache.extend(2, 3, lambda x: x * 2) == num
    assert torch.equal(cache.get(query, 3).values.cpu(), rows(query) * 2)
    cache.unlink()


@settings(max_examples=25, deadline=None)
@given(
    device_entries=st.integers(0, 6),
    host_entries=st.integers(0, 6),
    disk=st.booleans(),
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "get", "drop"]), st.integers(1, 2), st.sets(st.integers(0, 19), max_size=8)),
        max_size=12,
    ),
)
def test_any_sequence_of_puts_gets_drops_matches_a_model(
    device_entries: int, host_entries: int, disk: bool, ops: list[tuple[str, int, set[int]]]
) -> None:
    """Hits always return the value put for that id and boundary; an entry stays until its boundary is dropped;
    the number of entries equals what puts report; no tier exceeds its budget."""
    num = 20
    with tempfile.TemporaryDirectory() as root:
        cache = make(
            (Path(root) / "shm", Path(root) / "disk"),
            num,
            device_budget=device_entries * ENTRY,
            host_budget=file_budget(host_entries, num) if host_entries else 0,
            disk_budget=file_budget(5, num, checksum=True) if disk else 0,
        )
        cached: dict[int, set[int]] = {1: set(), 2: set()}
        for op, boundary, chosen in ops:
            ids = torch.tensor(sorted(chosen), dtype=torch.int64)
            values = rows(ids) + boundary  # a boundary's rows differ from the other's
            if op == "put":
                cache.put(ids, boundary, values)
            elif op == "drop":
                cache.drop(boundary)
                cached[boundary] = set()
            lookup = cache.get(ids, boundary)
            hits = set(ids[lookup.hit].tolist())
            assert torch.equal(lookup.values.reshape(-1, WIDTH), values[lookup.hit])
            assert cached[boundary] & set(chosen) <= hits  # nothing is evicted
            cached[boundary] |= hits
        stats = cache.stats
        assert sum(t.entries for t in stats.tiers) == sum(len(s) for s in cached.values())
        assert all(t.used_bytes <= t.budget_bytes for t in stats.tiers)
        cache.unlink()


def test_extend_only_some_ids_keeps_the_others_slots_for_their_put(dirs: tuple[Path, Path]) -> None:
    ids = torch.arange(10)
    # device holds 6 entries exactly, the disk segment the other 4: no room anywhere for a second boundary
    cache = make(dirs, 10, device_budget=6 * ENTRY, disk_budget=file_budget(4, 10, checksum=True))
    cache.put(ids, 1, rows(ids))
    mine = torch.tensor([0, 2, 7, 9])
    assert cache.extend(1, 2, lambda v: v + 1, only=mine) == 4
    assert cache.boundaries() == [2]
    lookup = cache.get(ids, 2)
    assert lookup.hit.tolist() == [i in (0, 2, 7, 9) for i in range(10)]
    assert torch.equal(lookup.values, rows(mine) + 1)
    others = ids[~lookup.hit]
    assert cache.put(others, 2, rows(others) + 1) == 6  # into the reserved slots: nothing rejected
    assert cache.stats.rejected == 0
    assert torch.equal(cache.get(ids, 2).values, rows(ids) + 1)
    assert [t.used_bytes for t in cache.stats.tiers] == [6 * ENTRY, file_budget(4, 10, checksum=True)]


def test_extend_only_with_a_new_shape_drops_both_boundaries(dirs: tuple[Path, Path]) -> None:
    ids = torch.arange(10)
    cache = make(dirs, 10, device_budget=10 * ENTRY)
    cache.put(ids, 1, rows(ids))
    assert cache.extend(1, 2, lambda v: v[:, :2], only=ids[:5]) == 0
    assert cache.boundaries() == []
    assert cache.put(ids, 2, rows(ids)[:, :2]) == 10  # the whole budget is free for the new boundary
