"""The disk tier never serves a wrong entry: a damaged header, index or entry, swapped index entries and a file of
another fingerprint are all detected, counted and recomputed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elastic_pipe.cache import ActivationCache, CacheError, prefix_fingerprint
from elastic_pipe.cache.layout import SegmentLayout

NUM = 20
WIDTH = 8
BOUNDARY = 3
FINGERPRINT = "model-a"


def rows(ids: torch.Tensor) -> torch.Tensor:
    return ids.float()[:, None] * 100 + torch.arange(WIDTH, dtype=torch.float32)


def disk_cache(tmp_path: Path, fingerprint: str = FINGERPRINT, *, name: str = "job") -> ActivationCache:
    return ActivationCache(NUM, disk_budget=1 << 20, disk_dir=tmp_path, name=name, fingerprint=fingerprint)


def filled(tmp_path: Path) -> tuple[Path, SegmentLayout]:
    """A disk segment of ids 0..19 (slot i holds id i), written and closed; its path and layout."""
    cache = disk_cache(tmp_path)
    ids = torch.arange(NUM)
    assert cache.put(ids, BOUNDARY, rows(ids)) == NUM
    cache.flush()
    cache.close()
    path = tmp_path / f"job.b{BOUNDARY}.slab"
    return path, SegmentLayout.parse(path.read_bytes()[:4096])


def flip(path: Path, offset: int, mask: int = 0x40) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def index_offset(layout: SegmentLayout, key: int) -> int:
    return layout.index_offset + 8 * key


def read_all(tmp_path: Path) -> tuple[ActivationCache, torch.Tensor, torch.Tensor]:
    """A fresh process's view: every id's lookup, then the batch as get_or_compute returns it."""
    cache = disk_cache(tmp_path)
    ids = torch.arange(NUM)
    hit = cache.get(ids, BOUNDARY).hit
    full = cache.get_or_compute(ids, BOUNDARY, ids, rows)
    return cache, hit, full


def test_a_flipped_header_byte_discards_the_file(tmp_path: Path) -> None:
    path, _ = filled(tmp_path)
    flip(path, 30)  # inside the JSON description: still parses as JSON only by luck, the crc32 catches it
    cache, hit, full = read_all(tmp_path)
    assert not hit.any()
    assert torch.equal(full, rows(torch.arange(NUM)))
    assert (cache.stats.corrupt_files, cache.stats.stale_files) == (1, 0)
    assert cache.get(torch.arange(NUM), BOUNDARY).num_hits == NUM  # the rewritten file serves again


@pytest.mark.parametrize(
    ("which", "mask"),
    [("index", 0x40), ("index", 0x01), ("data", 0x40)],
    ids=["index-past-the-slab", "index-to-id-6s-slot", "data"],
)
def test_a_flipped_index_or_data_byte_costs_one_entry(tmp_path: Path, which: str, mask: int) -> None:
    path, layout = filled(tmp_path)
    # id 7's index value now points past the slab (slot 71) or at id 6's slot; or one byte of slot 7's data changes
    offset = index_offset(layout, 7) if which == "index" else layout.data_offset + 7 * layout.entry_bytes + 2
    flip(path, offset, mask)
    cache, hit, full = read_all(tmp_path)
    assert hit.tolist() == [i != 7 for i in range(NUM)]
    assert cache.stats.corrupt == 1
    assert torch.equal(full, rows(torch.arange(NUM)))  # recomputed, never the damaged entry
    assert cache.get(torch.arange(NUM), BOUNDARY).num_hits == NUM and cache.stats.corrupt == 1


def test_swapped_index_entries_never_return_another_samples_activations(tmp_path: Path) -> None:
    path, layout = filled(tmp_path)
    with path.open("r+b") as f:
        f.seek(index_offset(layout, 4))
        a = f.read(8)
        f.seek(index_offset(layout, 11))
        b = f.read(8)
        f.seek(index_offset(layout, 4))
        f.write(b)
        f.seek(index_offset(layout, 11))
        f.write(a)
    cache, hit, full = read_all(tmp_path)
    assert hit.tolist() == [i not in (4, 11) for i in range(NUM)]
    assert cache.stats.corrupt == 2
    assert torch.equal(full, rows(torch.arange(NUM)))


def test_a_damaged_index_cannot_misdirect_a_write_outside_the_slab(tmp_path: Path) -> None:
    path, layout = filled(tmp_path)
    with path.open("r+b") as f:  # id 5: a reserved slot far past the end; the slot counter: garbage
        f.seek(index_offset(layout, 5))
        f.write((-(10**12)).to_bytes(8, "little", signed=True))
        f.seek(4096)
        f.write((-(7)).to_bytes(8, "little", signed=True))
    cache, hit, full = read_all(tmp_path)
    assert not hit[5] and torch.equal(full, rows(torch.arange(NUM)))
    # whatever the write overwrote was re-verified: every id now reads back its own value
    again = cache.get_or_compute(torch.arange(NUM), BOUNDARY, torch.arange(NUM), rows)
    assert torch.equal(again, rows(torch.arange(NUM)))
    assert torch.equal(cache.get(torch.arange(NUM), BOUNDARY).values, rows(torch.arange(NUM)))


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_file_of_another_fingerprint_is_never_served(tmp_path: Path, tier: str) -> None:
    budget = {f"{tier}_budget": 1 << 20, f"{tier}_dir": tmp_path}
    ids = torch.arange(NUM)
    other = ActivationCache(NUM, name="job", fingerprint="model-b", **budget)  # type: ignore[arg-type]
    other.put(ids, BOUNDARY, rows(ids) + 1)  # another model's outputs under the same cache name
    other.close()
    cache = ActivationCache(NUM, name="job", fingerprint=FINGERPRINT, **budget)  # type: ignore[arg-type]
    assert cache.get(ids, BOUNDARY).num_hits == 0
    assert cache.stats.stale_files == 1
    assert torch.equal(cache.get_or_compute(ids, BOUNDARY, ids, rows), rows(ids))
    assert torch.equal(cache.get(ids, BOUNDARY).values, rows(ids))


def test_an_old_format_file_is_discarded(tmp_path: Path) -> None:
    path, _ = filled(tmp_path)
    with path.open("r+b") as f:
        f.write(b"EPCACHE1")
    cache, hit, _ = read_all(tmp_path)
    assert not hit.any() and cache.stats.corrupt_files == 1


def test_prefix_fingerprint_changes_with_weights_config_dtype_and_shape() -> None:
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    base = prefix_fingerprint([w, torch.zeros(3)], "vit-tiny")
    assert base == prefix_fingerprint([w.clone(), torch.zeros(3)], "vit-tiny")
    assert len(base) == 64 and int(base, 16) >= 0
    changed = w.clone()
    changed[2, 1] += 1e-6
    others = {
        prefix_fingerprint([changed, torch.zeros(3)], "vit-tiny"),
        prefix_fingerprint([w, torch.zeros(3)], "vit-small"),
        prefix_fingerprint([w.double(), torch.zeros(3)], "vit-tiny"),
        prefix_fingerprint([w.reshape(3, 4), torch.zeros(3)], "vit-tiny"),
        prefix_fingerprint([torch.zeros(3), w], "vit-tiny"),
        prefix_fingerprint([w.to(torch.bfloat16), torch.zeros(3, dtype=torch.bool)], "vit-tiny"),
    }
    assert base not in others and len(others) == 6


def test_fingerprint_is_validated() -> None:
    with pytest.raises(CacheError, match="fingerprint must be at most 256 printable"):
        ActivationCache(NUM, fingerprint="x" * 257)
    with pytest.raises(CacheError, match="printable"):
        ActivationCache(NUM, fingerprint="a\nb")
