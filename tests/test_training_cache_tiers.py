"""``[pipeline] cache_tiers`` in training: the config, the tiers a run builds, the decision that weighs each tier,
entries spread over device, host and disk while the losses stay those of the uncached run, a disk entry that fails
its crc32 recomputed and counted (never used), and a file system that refuses the space."""

from __future__ import annotations

import errno
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe import cache as acache
from elastic_pipe.cache.layout import HEADER_BYTES, SegmentLayout
from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.orchestrator.config import PipelineSection
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.prefix import build as run_cache
from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

#: 300 digits: 240 training samples, 7 steps of 32 and a short one of 16 per epoch (drop_last = false).
SAMPLES = 300
#: One entry of the tiny ViT below: 17 tokens x 16 dims in float64.
ENTRY = 17 * 16 * 8


# ------------------------------------------------------------------------------------------------- the config
def test_cache_tiers_parse_sizes_and_round_trip() -> None:
    p = PipelineSection(cache_tiers={"device": "20GiB", "host": "1.5 GB", "disk": "/nvme/c", "disk_size": 4096})
    assert p.cache_tiers == {"device": 20 * 2**30, "host": 1_500_000_000, "disk": "/nvme/c", "disk_size": 4096}
    assert PipelineSection(cache_tiers=p.cache_tiers) == p  # to_dict's byte counts read back the same
    tiers = run_cache.cache_tiers(p)
    assert (tiers.device_bytes, tiers.host_bytes, tiers.disk_dir, tiers.disk_bytes) == (
        20 * 2**30,
        1_500_000_000,
        "/nvme/c",
        4096,
    )
    assert tiers.host_kind is acache.HostKind.SHARED


def test_without_cache_tiers_the_device_tier_is_cache_mb_and_a_disk_without_size_is_unbounded() -> None:
    assert run_cache.cache_tiers(PipelineSection(cache_mb=3)) == acache.CacheTiers(3 << 20)
    tiers = run_cache.cache_tiers(PipelineSection(cache_tiers={"disk": "/scratch", "host_kind": "pinned"}))
    assert tiers.disk_bytes == run_cache.UNBOUNDED_DISK and tiers.host_kind is acache.HostKind.PINNED


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ({"cache_tiers": {"hots": "1GiB"}}, "unknown key 'hots'"),
        ({"cache_tiers": {"device": "20 gigs"}}, "cache_tiers.device: cannot read '20 gigs'"),
        ({"cache_tiers": {"host": -1}}, "cache_tiers.host: a byte size must be >= 0, got -1"),
        ({"cache_tiers": {"disk": 7}}, "cache_tiers.disk must be a string, got 7"),
        ({"cache_tiers": {"disk_size": "1TB"}}, "needs a disk directory"),
        ({"cache_tiers": {"host_kind": "remote"}}, "'remote'"),
        ({"cache_tiers": "20GiB"}, "cache_tiers must be a table"),
        ({"cache_policy": "sometimes"}, "'sometimes'"),
        ({"views": 3}, "views = 3 needs cache_policy = 'views'"),
        ({"cache_policy": "views", "views": 0}, "pipeline.views must be an integer >= 1, got 0"),
    ],
)
def test_bad_cache_keys_are_refused_naming_the_value(pipeline: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        PipelineSection(**pipeline)
    assert message in str(info.value)


# ------------------------------------------------------------------------------------------------- the decision
def test_the_tiered_decision_weighs_each_tier_by_the_entries_it_would_hold() -> None:
    spread = {"device": 10, "host": 30, "none": 60}
    # 10% at 1 s, 30% at 2 s, 60% recomputed at 5 s
    assert acache.expected_read_seconds(spread, {"device": 1.0, "host": 2.0}, 5.0) == pytest.approx(3.7)
    assert acache.expected_read_seconds({"device": 0, "none": 8}, {}, 5.0) == math.inf
    cache = acache.ActivationCache(100, device_budget=10 * 64 * 4, host_budget=1 << 20, host_kind="pinned")
    assert cache.placement(3, (64,), torch.float32, 100) == {"device": 10, "host": 90, "none": 0}
    cache.put(torch.arange(4), 3, torch.ones(4, 64))  # an existing segment keeps its slots
    assert cache.placement(3, (64,), torch.float32, 100) == {"device": 10, "host": 90, "none": 0}
    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
    decision = acache.measure_tiered_payoff(cache, torch.randn(16, 64), 3, layers, samples=100, repeats=2)
    assert "device 10 (" in decision.reason and "host 90 (" in decision.reason
    assert cache.stats.tiers[1].entries == 0  # the measurement stored nothing


# ------------------------------------------------------------------------------------------------- disk full
def test_a_file_system_that_refuses_the_space_leaves_entries_uncached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    cache = acache.ActivationCache(20, disk_budget=1 << 20, disk_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="elastic_pipe.cache.tiers"):
        assert cache.put(torch.arange(5), 2, torch.ones(5, 8)) == 0
    stats = cache.stats
    assert (stats.full_files, stats.rejected, stats.tiers[0].entries) == (1, 5, 0)
    assert "No space left on device" in caplog.text and str(tmp_path) in caplog.text
    assert cache.get(torch.arange(5), 2).num_hits == 0  # recomputed when needed, never a crash
    assert list(tmp_path.iterdir()) == []  # no half-made segment file left behind


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_pinned_host_tier_is_carried_on_the_gpu_through_pinned_staging() -> None:
    cuda = torch.device("cuda")
    cache = acache.ActivationCache(
        600, device_budget=100 * 64 * 4, host_budget=1 << 20, host_kind="pinned", device=cuda
    )
    ids = torch.randperm(600, generator=torch.Generator().manual_seed(0))
    values = torch.randn(600, 64, generator=torch.Generator().manual_seed(1))
    cache.put(ids, 2, values.to(cuda))
    assert [t.entries for t in cache.stats.tiers] == [100, 500]
    # more entries than one chunk of extend (256), so the pinned staging is reused across chunks
    assert cache.extend(2, 3, lambda v: v * 2 + 1) == 600
    lookup = cache.get(ids, 3)
    assert lookup.num_hits == 600 and torch.equal(lookup.values.cpu(), values * 2 + 1)


# ------------------------------------------------------------------------------------------------- training
def _config(**pipeline: Any) -> Any:
    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
            "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", **pipeline},
            "launch": {"nproc_per_node": 2},
            "log": {"progress": False},
            "data": {"drop_last": False},
        }
    )


def _corrupt_disk_entries(directory: Path, count: int) -> int:
    """Flip a byte in the data of the first ``count`` entries of every disk segment file; returns how many."""
    flipped = 0
    for path in sorted(directory.glob("*.slab")):
        with path.open("r+b") as f:
            layout = SegmentLayout.parse(f.read(HEADER_BYTES))
            for slot in range(min(count, layout.capacity)):
                f.seek(layout.data_offset + slot * layout.entry_bytes + 3)
                byte = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([byte[0] ^ 0xFF]))
                flipped += 1
    return flipped


def _tiered_runs(ctx: RankContext, root: str) -> dict[str, Any]:
    import torch.distributed as dist
    from plug_data import Digits

    from elastic_pipe.orchestrator import ElasticTrainer

    out: dict[str, Any] = {}
    # 40 entries on the device, 100 in /dev/shm (shared by both ranks), the rest on disk
    host = SegmentLayout((17, 16), torch.float64, 100, SAMPLES).file_bytes  # a file of 100 entries
    tiers = {"device": 40 * ENTRY, "host": host, "disk": f"{root}/spread"}
    runs = (
        ("off", {"cache": "off"}),
        ("tiers", {"cache": "on", "cache_tiers": tiers}),
        ("auto", {"cache": "auto", "cache_tiers": tiers}),
        ("disk", {"cache": "on", "cache_tiers": {"device": 0, "disk": f"{root}/crc"}}),
    )
    for name, pipeline in runs:
        flipped: list[int] = []

        def corrupt(trainer: Any, name: str = name, flipped: list[int] = flipped) -> None:
            # after the transition into epoch 2: damage entries the next epoch will read
            if name == "disk" and trainer.state.epoch == 2:
                if ctx.rank == 0:
                    flipped.append(_corrupt_disk_entries(Path(root) / "crc", 5))
                dist.barrier()

        with ElasticTrainer(_config(**pipeline), data=Digits(SAMPLES), quiet=True) as trainer:
            out[name] = trainer.fit(on_epoch_end=corrupt).to_dict()
            cache = trainer.prefix.cache
            out[name + "_tiers"] = [] if cache is None else [(t.name, t.entries) for t in cache.stats.tiers]
            out[name + "_flipped"] = flipped
            out[name + "_complete"] = trainer.prefix.cache_complete  # steps loaded labels only
        out[name + "_left"] = sorted(p.name for p in Path(root).rglob("*.slab"))
    return out


@pytest.mark.distributed
@pytest.mark.slow
def test_tiers_spread_the_entries_and_a_corrupt_disk_entry_is_recomputed(tmp_path: Path) -> None:
    results = run_distributed(_tiered_runs, 2, str(tmp_path), timeout=500)
    r0 = results[0]
    off = r0["off"]
    for name in ("tiers", "auto", "disk"):
        assert r0[name]["losses"] == pytest.approx(off["losses"], rel=1e-10, abs=1e-12), name
        assert r0[name + "_left"] == []  # the run's files are deleted when it closes
    # 240 entries: 40 on the device of each stage-0 rank, 100 in the node's shared memory, 100 on disk
    assert dict(r0["tiers_tiers"]) == {"device": 40, "host": 100, "disk": 100}
    assert r0["tiers_complete"] and r0["disk_complete"] and not r0["off_complete"]
    tiers = r0["tiers"]["epochs"]
    assert [e["cache"] for e in tiers] == [False, True, True]
    assert [(e["cache_hits"], e["cache_misses"], e["cache_corrupt"]) for e in tiers] == [(0, 0, 0)] + [(240, 0, 0)] * 2
    # the disk-only run: the damaged entries fail their crc32, are counted, recomputed and never used
    disk = r0["disk"]["epochs"]
    flipped = r0["disk_flipped"][0]
    assert flipped == 5
    assert [e["cache_corrupt"] for e in disk] == [0, 0, flipped]
    assert disk[2]["cache_misses"] == flipped and disk[2]["cache_hits"] == 240 - flipped
    assert results[1]["disk"]["losses"] == r0["disk"]["losses"]
