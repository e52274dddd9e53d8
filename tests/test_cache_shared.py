"""Several processes of one node share the host tier: one writes, all read; overlapping writes store each sample
once; a collective boundary move is seen by every process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elastic_pipe.cache import ActivationCache
from elastic_pipe.testing.distributed import RankContext, run_distributed

NUM = 48
WIDTH = 16


def _rows(ids: torch.Tensor) -> torch.Tensor:
    return ids.double()[:, None] * 1000 + torch.arange(WIDTH, dtype=torch.float64)


def _shared(ctx: RankContext, name: str, host_dir: str) -> dict[str, object]:
    cache = ActivationCache(NUM, host_budget=1 << 20, name=name, host_dir=host_dir, leader=ctx.rank == 0)
    ids = torch.arange(NUM)
    if ctx.rank == 0:
        cache.put(ids[: NUM // 2], 2, _rows(ids[: NUM // 2]))
    dist.barrier()
    first = cache.get(ids, 2)  # every rank reads what rank 0 wrote
    first_ok = torch.equal(first.values, _rows(ids[: NUM // 2]))
    dist.barrier()
    # every rank stores an overlapping window of the second half at the same time
    window = torch.arange(NUM // 2 + 4 * ctx.rank, NUM // 2 + 4 * ctx.rank + 12).clamp(max=NUM - 1).unique()
    stored = cache.put(window, 2, _rows(window))
    dist.barrier()
    stats = cache.stats
    dist.barrier()
    cache.extend(2, 3, lambda x: x * 2)  # collective: the leader rewrites the shared file
    dist.barrier()
    after = cache.get(ids, 3)
    after_ok = torch.equal(after.values, _rows(ids[after.hit]) * 2)
    old_hits = cache.get(ids, 2).num_hits
    dist.barrier()
    if ctx.rank == 0:
        cache.unlink()
    else:
        cache.close()
    return {
        "first_hits": first.num_hits,
        "first_ok": first_ok,
        "stored": stored,
        "entries": stats.tiers[0].entries,
        "after_hit": after.hit.tolist(),
        "after_ok": after_ok,
        "old_hits": old_hits,
    }


@pytest.mark.distributed
def test_processes_share_the_host_tier(tmp_path: Path) -> None:
    results = run_distributed(_shared, 3, "shared-test", str(tmp_path), timeout=120.0)
    assert [r["first_hits"] for r in results] == [NUM // 2] * 3
    assert all(r["first_ok"] for r in results)
    # windows [24, 36), [28, 40), [32, 44): their union (20 ids) is written exactly once between the three ranks
    assert sum(r["stored"] for r in results) == 20
    assert {r["entries"] for r in results} == {NUM // 2 + 20}
    expected = [i < NUM // 2 + 20 for i in range(NUM)]
    assert all(r["after_hit"] == expected and r["after_ok"] and r["old_hits"] == 0 for r in results)
    assert list(tmp_path.iterdir()) == []
