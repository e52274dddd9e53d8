"""Tiers from plain config numbers: byte sizes parsed, CacheTiers validated, caches built with a writable-dir check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elastic_pipe.cache import ActivationCache, CacheDirError, CacheError, CacheTiers, HostKind, parse_bytes
from elastic_pipe.types import ByteSizeError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20GiB", 20 * 2**30),
        ("20gib", 20 * 2**30),
        (" 512 MiB ", 512 * 2**20),
        ("1.5kB", 1500),
        ("1.5KiB", 1536),
        ("2TB", 2 * 10**12),
        ("4096", 4096),
        ("7B", 7),
        ("0", 0),
        (".5GiB", 2**29),
        (123, 123),
        ("20G", 20 * 10**9),  # one grammar (elastic_pipe.types.parse_bytes): a bare SI letter is a power of 1000
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["20 GiBs", "-1", "1.2.3", "", "GiB", -5, True, 1.5])
def test_parse_bytes_refuses_with_the_valid_units(text: object) -> None:
    with pytest.raises(ByteSizeError, match=r"byte size"):
        parse_bytes(text)  # type: ignore[arg-type]


def test_cache_tiers_parse_and_validate() -> None:
    tiers = CacheTiers.parse("20GiB", host="64GiB", disk_dir="/scratch/c", disk="1TB", host_kind="pinned")
    assert tiers == CacheTiers(20 * 2**30, 64 * 2**30, "/scratch/c", 10**12, HostKind.PINNED)
    assert tiers.total_bytes == 84 * 2**30 + 10**12
    assert CacheTiers(1 << 20).host_kind is HostKind.SHARED


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device_bytes": -1}, r"device_bytes must be an int >= 0 \(bytes\), got -1"),
        ({"device_bytes": "1GiB"}, r"got '1GiB'; parse strings with CacheTiers.parse"),
        ({"device_bytes": 0, "host_bytes": True}, "host_bytes must be an int"),
        ({"device_bytes": 0, "disk_bytes": 5}, "disk_bytes=5 needs a disk_dir"),
        ({"device_bytes": 0, "disk_dir": "/x"}, "disk_dir='/x' is given but disk_bytes is 0"),
        ({"device_bytes": 0, "host_kind": "numa"}, "unknown host_kind 'numa'; expected one of: 'shared', 'pinned'"),
        ({"device_bytes": 0, "host_kind": "pinned", "host_dir": "/d"}, "a pinned host tier has no files"),
    ],
)
def test_cache_tiers_errors_name_the_bad_value(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(CacheError, match=match):
        CacheTiers(**kwargs)  # type: ignore[arg-type]


def test_from_tiers_builds_all_three_tiers_and_spills(tmp_path: Path) -> None:
    entry = 8 * 4
    pinned = CacheTiers(4 * entry, 3 * entry, str(tmp_path / "disk"), 1 << 16, HostKind.PINNED)
    cache = ActivationCache.from_tiers(10, pinned, fingerprint="model-a")
    ids = torch.arange(10)
    values = ids.float()[:, None] * torch.ones(8)
    assert cache.put(ids, 2, values) == 10
    stats = cache.stats
    assert [(t.name, t.entries) for t in stats.tiers] == [("device", 4), ("host", 3), ("disk", 3)]
    assert torch.equal(cache.get(ids, 2).values, values)
    assert cache.config.fingerprint == "model-a" and (tmp_path / "disk").is_dir()
    cache.unlink()
    shared = ActivationCache.from_tiers(10, CacheTiers(0, 3 * 4096, host_dir=str(tmp_path / "shm")), name="job")
    shared.put(ids[:2], 1, values[:2])
    assert [p.name for p in (tmp_path / "shm").iterdir()] == ["job.b1.slab"]
    shared.unlink()


def test_an_unwritable_disk_dir_is_named_at_construction(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad = blocker / "cache"
    with pytest.raises(CacheDirError, match=f"the cache's disk directory '{bad}' is not writable") as info:
        ActivationCache.from_tiers(10, CacheTiers(0, disk_dir=str(bad), disk_bytes=1 << 20))
    assert (info.value.tier, info.value.path) == ("disk", str(bad))
    with pytest.raises(CacheDirError, match="host directory"):
        ActivationCache(10, host_budget=1 << 20, host_dir=bad)
