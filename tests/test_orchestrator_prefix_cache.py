"""The frozen prefix's activation cache filled by several replicas together: split work, the same entries."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.cache import ActivationCache
from elastic_pipe.orchestrator.data import Split
from elastic_pipe.orchestrator.prefix import fill as prefix_cache
from elastic_pipe.orchestrator.prefix.carry import CacheJob, FillPeers
from elastic_pipe.orchestrator.prefix.shared import fill_shared
from elastic_pipe.testing import RankContext, run_distributed

pytestmark = pytest.mark.distributed

SAMPLES = 37  # not a multiple of the chunk: the last round is ragged
CHUNK = 4


def _layers() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(6, 6, dtype=torch.float64), nn.Tanh()) for _ in range(4))


def _split() -> Split:
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randn(SAMPLES, 6, dtype=torch.float64, generator=gen)
    # shuffled ids: entries must land under each sample's own id, not its row
    ids = torch.randperm(SAMPLES, generator=gen)
    return Split(inputs, torch.zeros(SAMPLES, dtype=torch.long), ids)


# One job per world size: starting the ranks (spawn, import torch) costs far more than any task here, so every task
# of a world size runs in one job, one after the other, and each test reads its task's results. Each task still makes
# its own cache and its own process groups (``dist.new_group``), exactly as when it had a job to itself.
_JOBS: dict[int, list[tuple[Any, ...]]] = {
    2: [
        ("fill_then_carry", 2, False),
        ("fill_then_carry", 2, True),
        ("carry_partial", 2),
        ("disagree",),
        ("fill_both_ways", 2),
        ("shared_fill_in_a_tight_budget", 2),
    ],
    3: [("fill_then_carry", 3, False), ("fill_both_ways", 3)],
}

Results = Callable[..., list[Any]]


def _run_tasks(ctx: RankContext, tasks: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], Any]:
    functions: dict[str, Callable[..., Any]] = {
        "fill_then_carry": _fill_then_carry,
        "carry_partial": _carry_partial,
        "disagree": _disagree,
        "fill_both_ways": _fill_both_ways,
        "shared_fill_in_a_tight_budget": _shared_fill_in_a_tight_budget,
    }
    return {task: functions[task[0]](ctx, *task[1:]) for task in tasks}


@pytest.fixture(scope="module")
def jobs() -> Iterator[Results]:
    """``jobs(world, name, *args)``: that task's result on every rank of the job of ``world`` ranks, which runs
    when a test first asks for it."""
    done: dict[int, list[dict[tuple[Any, ...], Any]]] = {}

    def of(world: int, *task: Any) -> list[Any]:
        if world not in done:
            # each task had 60 s (the budget test 120 s) as a job of its own: the job gets their sum
            done[world] = run_distributed(_run_tasks, world, _JOBS[world], timeout=60.0 * len(_JOBS[world]) + 60.0)
        return [by_task[task] for by_task in done[world]]

    yield of


def _prepare_together(
    cache: ActivationCache,
    data: Split,
    run: Any,
    *,
    mode: str,
    old_frozen: int,
    frozen: int,
    world: int,
    example: torch.Tensor | None = None,
) -> tuple[bool, str]:
    """``prepare_cache`` called by every rank of the world as one replica's stage 0 each."""
    group = dist.new_group(list(range(world)))
    job = CacheJob(cache, data, old_frozen, frozen, CHUNK, torch.device("cpu"), run, example)
    return prefix_cache.prepare_cache(
        job, mode=mode, per_replica=8, peers=FillPeers(group, dist.get_rank(group), world)
    )


def _fill_then_carry(ctx: RankContext, world: int, with_example: bool) -> dict[str, Any]:
    layers, data = _layers(), _split()
    rows_run = [0]

    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        rows_run[0] += x.shape[0]
        with torch.no_grad():
            for j in range(lo, hi):
                x = layers[j](x)
        return x

    cache = ActivationCache(SAMPLES, device_budget=2**20)
    first = _prepare_together(cache, data, run, mode="on", old_frozen=0, frozen=1, world=world)
    rows_first = rows_run[0]
    example = None
    if with_example:  # the caller knows the entries' shape: no one-row probe through the prefix
        with torch.no_grad():
            example = layers[2](layers[1](layers[0](data.inputs[:1])))
    second = _prepare_together(cache, data, run, mode="on", old_frozen=1, frozen=3, world=world, example=example)
    with cache.uncounted():
        lookup = cache.get(data.sample_ids, 3)
    return {
        "enabled": (first[0], second[0]),
        "boundaries": cache.boundaries(),
        "hits": int(lookup.hit.sum()),
        "values": lookup.values.tolist(),  # plain data: tensors do not survive the result queue
        "rows_first": rows_first,
        "rows_second": rows_run[0] - rows_first,
    }


@pytest.mark.parametrize(("world", "with_example"), [(2, False), (3, False), (2, True)])
def test_replicas_split_the_fill_and_all_hold_every_entry(jobs: Results, world: int, with_example: bool) -> None:
    results = jobs(world, "fill_then_carry", world, with_example)
    layers, data = _layers(), _split()
    with torch.no_grad():
        expected = data.inputs
        for j in range(3):
            expected = layers[j](expected)
    # the cache returns rows in the order of the ids asked for: the split's own order
    for r in results:
        assert r["enabled"] == (True, True)
        assert r["boundaries"] == [3]  # the old boundary was dropped after the carry
        assert r["hits"] == SAMPLES
        torch.testing.assert_close(torch.tensor(r["values"], dtype=torch.float64), expected, rtol=1e-12, atol=1e-12)
    # each peer computed only its share of the chunks (plus a one-row probe per pass without an example)
    chunks = -(-SAMPLES // CHUNK)
    for rank, r in enumerate(results):
        mine = sum(min(CHUNK, SAMPLES - c * CHUNK) for c in range(rank, chunks, world))
        assert r["rows_first"] == mine + 1
        assert r["rows_second"] == mine + (0 if with_example else 1)
    assert sum(r["rows_first"] for r in results) == SAMPLES + world


def _run_layers(layers: nn.ModuleList) -> Any:
    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        with torch.no_grad():
            for j in range(lo, hi):
                x = layers[j](x)
        return x

    return run


def _carry_partial(ctx: RankContext, world: int) -> list[list[float]]:
    """Only some samples are cached at the old boundary: the rest start from their inputs."""
    layers, data = _layers(), _split()
    run = _run_layers(layers)
    cache = ActivationCache(SAMPLES, device_budget=2**20)
    some = data.sample_ids[: SAMPLES // 2]
    cache.put(some, 1, run(data.inputs[: SAMPLES // 2], 0, 1))
    _prepare_together(cache, data, run, mode="on", old_frozen=1, frozen=3, world=world)
    assert cache.boundaries() == [3]
    with cache.uncounted():
        lookup = cache.get(data.sample_ids, 3)
    assert int(lookup.hit.sum()) == SAMPLES
    return lookup.values.tolist()


def test_a_partly_cached_old_boundary_is_completed_from_the_inputs(jobs: Results) -> None:
    layers, data = _layers(), _split()
    expected = _run_layers(layers)(data.inputs, 0, 3)
    for values in jobs(2, "carry_partial", 2):
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float64), expected, rtol=1e-12, atol=1e-12)


def _disagree(ctx: RankContext) -> tuple[bool, str, list[int]]:
    """Rank 1's stage 0 finds that reading does not pay: no replica reads, and nobody waits in a fill."""
    # patched in this child process only, and only for this task (the rank runs the module's other tasks too)
    original = prefix_cache._decide
    prefix_cache._decide = lambda *a, **k: (ctx.rank == 0, f"rank {ctx.rank} measured")  # type: ignore[assignment]
    try:
        layers, data = _layers(), _split()
        run = _run_layers(layers)
        cache = ActivationCache(SAMPLES, device_budget=2**20)
        cache.put(data.sample_ids, 1, run(data.inputs, 0, 1))
        enabled, reason = _prepare_together(cache, data, run, mode="auto", old_frozen=1, frozen=2, world=2)
    finally:
        prefix_cache._decide = original
    return enabled, reason, cache.boundaries()


def test_replicas_read_the_cache_only_if_all_agree(jobs: Results) -> None:
    (on0, why0, b0), (on1, why1, b1) = jobs(2, "disagree")
    assert not on0 and not on1
    assert "not on another replica" in why0 and why1 == "rank 1 measured"
    assert b0 == b1 == []  # the old boundary is dropped and nothing was filled


def _fill_both_ways(ctx: RankContext, world: int) -> dict[str, list[list[float]]]:
    """The same fill with each round's all-gather overlapped with the next round's compute, and without."""
    layers, data = _layers(), _split()
    run = _run_layers(layers)
    group = dist.new_group(list(range(world)))
    peers = FillPeers(group, dist.get_rank(group), world)
    out = {}
    for overlap in (True, False):
        cache = ActivationCache(SAMPLES, device_budget=2**20)
        fill_shared(CacheJob(cache, data, 0, 2, CHUNK, torch.device("cpu"), run), peers, overlap=overlap)
        with cache.uncounted():
            lookup = cache.get(data.sample_ids, 2)
        assert int(lookup.hit.sum()) == SAMPLES
        out[str(overlap)] = lookup.values.tolist()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_overlapped_and_sequential_fills_store_the_same_entries(jobs: Results, world: int) -> None:
    layers, data = _layers(), _split()
    expected = _run_layers(layers)(data.inputs, 0, 2)
    for result in jobs(world, "fill_both_ways", world):
        assert result["True"] == result["False"]  # the same chunks through the same layers: bit for bit
        # against one pass over the whole split, only the batch size of the matrix products differs
        torch.testing.assert_close(torch.tensor(result["True"], dtype=torch.float64), expected, rtol=1e-12, atol=1e-12)


BIG = 1000  # samples of the budget test
BIG_CHUNK = 50
ENTRY_BYTES = 6 * 8  # one float64 row of width 6


def _shared_fill_in_a_tight_budget(ctx: RankContext, world: int) -> dict[str, int]:
    """A device budget of 1.2x one boundary's entries: the shared fill must reuse the old boundary's memory."""
    layers = _layers()
    gen = torch.Generator().manual_seed(2)
    data = Split(torch.randn(BIG, 6, dtype=torch.float64, generator=gen), torch.zeros(BIG), torch.randperm(BIG))
    run = _run_layers(layers)
    cache = ActivationCache(BIG, device_budget=BIG * ENTRY_BYTES * 6 // 5)
    group = dist.new_group(list(range(world)))
    peers = FillPeers(group, dist.get_rank(group), world)
    for old, new in ((0, 1), (1, 3)):
        job = CacheJob(cache, data, old, new, BIG_CHUNK, torch.device("cpu"), run)
        prefix_cache.prepare_cache(job, mode="on", per_replica=8, peers=peers)
    with cache.uncounted():
        lookup = cache.get(data.sample_ids, 3)
    expected = run(data.inputs, 0, 3)[lookup.hit]
    stats = cache.stats
    return {
        "cached": lookup.num_hits,
        "exact": int(torch.allclose(lookup.values, expected, rtol=1e-12, atol=1e-12)),
        "used": stats.tiers[0].used_bytes,
        "boundaries": len(cache.boundaries()),
    }


def test_the_shared_fill_reuses_the_old_boundarys_budget(jobs: Results) -> None:
    # the defect: the new boundary was sized to what the old one left (0.2x), 200 of 1000 samples
    for r in jobs(2, "shared_fill_in_a_tight_budget", 2):
        assert r == {"cached": BIG, "exact": 1, "used": BIG * ENTRY_BYTES, "boundaries": 1}
