"""``[pipeline] cache_dtype``: the config, a cache that stores its entries narrower in every tier (and sizes its
budgets by the stored bytes), reads cast back to the prefix output's dtype, misses rounded like hits, and a training
run with bfloat16 entries next to one with the default (unchanged: the losses of the run without the cache)."""

from __future__ import annotations

import math
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
from elastic_pipe.orchestrator.prefix.carry import widening
from elastic_pipe.orchestrator.prefix.reads import read_prefix
from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

#: 300 digits: 240 training samples, 7 steps of 32 and a short one of 16 per epoch (drop_last = false).
SAMPLES = 300
TRAIN = 240
#: bfloat16 keeps 8 significant bits: round to nearest is off by at most half a unit in the last place, 2**-8.
BF16_REL = 2.0**-8


# ------------------------------------------------------------------------------------------------- the config
@pytest.mark.parametrize("name", ["auto", "bfloat16", "float16", "float32"])
def test_cache_dtype_accepts_the_floating_names(name: str) -> None:
    assert PipelineSection(cache_dtype=name).cache_dtype == name
    expected = None if name == "auto" else getattr(torch, name)
    assert acache.parse_storage_dtype(name) == expected


def test_cache_dtype_defaults_to_auto_and_reads_back_from_a_table() -> None:
    assert PipelineSection().cache_dtype == "auto"
    config = config_from_tables({"model": tiny_vit.model_table(), "pipeline": {"cache_dtype": "bfloat16"}})
    assert config.pipeline.cache_dtype == "bfloat16"


@pytest.mark.parametrize("value", ["bf16", "int8", "float64", "", 16, None])
def test_a_bad_cache_dtype_is_refused_naming_the_value(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        PipelineSection(cache_dtype=value)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("pipeline.cache_dtype must be one of auto, bfloat16, float16, float32")
    assert repr(value) in message and "\n" not in message


def test_the_cache_refuses_a_storage_dtype_that_is_not_floating() -> None:
    with pytest.raises(acache.CacheError, match="storage_dtype must be a floating torch dtype"):
        acache.ActivationCache(4, device_budget=1 << 10, storage_dtype=torch.int8)
    with pytest.raises(acache.CacheError, match="unknown storage dtype 'bf16'"):
        acache.parse_storage_dtype("bf16")


# ------------------------------------------------------------------------------------------------- the cache
def test_a_storage_dtype_only_narrows_floating_entries() -> None:
    assert acache.stored_dtype(torch.float32, torch.bfloat16) == torch.bfloat16
    assert acache.stored_dtype(torch.float64, torch.float32) == torch.float32
    assert acache.stored_dtype(torch.float32, None) == torch.float32
    # wider, or as wide: kept as it is (no bytes saved, so no rounding); integers are never converted
    assert acache.stored_dtype(torch.bfloat16, torch.float32) == torch.bfloat16
    assert acache.stored_dtype(torch.bfloat16, torch.float16) == torch.bfloat16
    assert acache.stored_dtype(torch.int64, torch.bfloat16) == torch.int64
    cache = acache.ActivationCache(8, device_budget=1 << 12, storage_dtype=torch.bfloat16)
    ints = torch.arange(4 * 3).reshape(4, 3)
    cache.put(torch.arange(4), 1, ints)
    lookup = cache.get(torch.arange(4), 1)
    assert lookup.values.dtype == torch.int64 and torch.equal(lookup.values, ints)


def _tiers(root: Path) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("device", {"device_budget": 1 << 16}),
        ("pinned", {"host_budget": 1 << 16, "host_kind": "pinned"}),
        ("shared", {"host_budget": 1 << 16, "host_dir": root / "shm"}),
        ("disk", {"disk_budget": 1 << 16, "disk_dir": root / "disk"}),
    ]


@pytest.mark.parametrize("tier", range(4))
def test_every_tier_stores_the_narrower_dtype_in_half_the_bytes(tmp_path: Path, tier: int) -> None:
    name, budgets = _tiers(tmp_path)[tier]
    values = torch.randn(12, 5, 7, generator=torch.Generator().manual_seed(tier))
    ids = torch.arange(12)
    used = {}
    for storage in (None, torch.bfloat16):
        cache = acache.ActivationCache(40, name=f"t{tier}-{storage is None}", storage_dtype=storage, **budgets)
        try:
            assert cache.put(ids, 2, values) == 12
            lookup = cache.get(ids, 2)
            assert lookup.num_hits == 12
            used[storage] = cache.stats.tiers[0].used_bytes
            if storage is None:
                assert lookup.values.dtype == torch.float32 and torch.equal(lookup.values, values)
                continue
            assert lookup.values.dtype == torch.bfloat16  # read as stored; the caller casts back
            back = lookup.to(torch.float32).values
            assert back.dtype == torch.float32
            assert torch.equal(back, values.to(torch.bfloat16).float())  # exactly a cast, not some other rounding
            assert torch.all((back - values).abs() <= BF16_REL * values.abs())
            assert not torch.equal(back, values)
            assert torch.equal(cache.rounded(values), back)  # what a recomputed miss is given
            if name in ("shared", "disk"):
                (path,) = (tmp_path / name.replace("shared", "shm")).glob(f"t{tier}-False*")
                layout = SegmentLayout.parse(path.read_bytes()[:HEADER_BYTES])
                assert layout.dtype == torch.bfloat16 and layout.entry_bytes == 5 * 7 * 2
        finally:
            cache.unlink()
    if name not in {"shared", "disk"}:  # a file also holds its header and index (its entries are checked above)
        assert used[torch.bfloat16] * 2 == used[None]


def test_the_budgets_hold_twice_the_entries_and_the_fill_plan_says_so() -> None:
    entry = 64 * 4  # a float32 entry
    plain = acache.ActivationCache(100, device_budget=10 * entry)
    narrow = acache.ActivationCache(100, device_budget=10 * entry, storage_dtype=torch.bfloat16)
    assert plain.placement(3, (64,), torch.float32, 100) == {"device": 10, "none": 90}
    assert narrow.placement(3, (64,), torch.float32, 100) == {"device": 20, "none": 80}
    values = torch.randn(30, 64)
    assert plain.put(torch.arange(30), 3, values) == 10
    assert narrow.put(torch.arange(30), 3, values) == 20
    assert (plain.stats.rejected, narrow.stats.rejected) == (20, 10)


def test_extend_hands_fn_the_stored_entries_and_stores_its_outputs_narrowed() -> None:
    cache = acache.ActivationCache(20, device_budget=1 << 14, storage_dtype=torch.bfloat16)
    values = torch.randn(10, 8, generator=torch.Generator().manual_seed(3))
    cache.put(torch.arange(10), 1, values)
    seen: list[torch.dtype] = []
    layer = torch.nn.Linear(8, 8)

    def fn(v: torch.Tensor) -> torch.Tensor:
        seen.append(v.dtype)
        return layer(v.float())  # what widening() does for the orchestrator's sub-layers

    with torch.no_grad():
        assert cache.extend(1, 2, fn) == 10
        expected = layer(values.to(torch.bfloat16).float()).to(torch.bfloat16)
    assert seen == [torch.bfloat16]
    lookup = cache.get(torch.arange(10), 2)
    assert lookup.values.dtype == torch.bfloat16 and torch.equal(lookup.values, expected)


def test_widening_casts_cached_entries_to_the_dtype_the_sublayer_expects() -> None:
    calls: list[tuple[torch.dtype, int, int]] = []

    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        calls.append((x.dtype, lo, hi))
        return x

    widened = widening(run, lambda lo: torch.float64)
    widened(torch.zeros(2, dtype=torch.bfloat16), 2, 3)
    widened(torch.zeros(2, dtype=torch.uint8), 0, 3)  # the model's input is never cast
    assert calls == [(torch.float64, 2, 3), (torch.uint8, 0, 3)]


def test_a_batch_of_hits_and_misses_gives_every_sample_the_same_rounding() -> None:
    inputs = torch.randn(8, 6, generator=torch.Generator().manual_seed(4))
    ids = torch.arange(8)
    cache = acache.ActivationCache(8, device_budget=1 << 12, storage_dtype=torch.bfloat16)

    def prefix(x: torch.Tensor) -> torch.Tensor:  # elementwise: a row's value does not depend on its batch
        return torch.sin(x) * 3 + 0.1

    cache.put(ids[:3], 1, prefix(inputs[:3]))  # samples 0..2 hit, 3..7 miss
    mixed = read_prefix(cache, None, ids, inputs, frozen=1, run_prefix=prefix, dtype=torch.float32)
    assert mixed.dtype == torch.float32 and cache.stats.stored == 8
    all_hits = read_prefix(cache, None, ids, inputs, frozen=1, run_prefix=prefix, dtype=torch.float32)
    assert torch.equal(mixed, all_hits)  # a sample's value does not depend on whether it hit
    computed = prefix(inputs)
    assert torch.equal(all_hits, computed.to(torch.bfloat16).float())
    # the default stores the outputs as they are: exact
    exact = acache.ActivationCache(8, device_budget=1 << 12)
    exact.put(ids[:3], 1, prefix(inputs[:3]))
    out = read_prefix(exact, None, ids, inputs, frozen=1, run_prefix=prefix, dtype=torch.float32)
    assert torch.equal(out, computed)


# ------------------------------------------------------------------------------------------------- training
def _config(**pipeline: Any) -> Any:
    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "train": {"dtype": "float32", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
            "pipeline": {"microbatches": 1, "pipe_len": 1, **pipeline},
            "log": {"progress": False},
            "data": {"drop_last": False},
        }
    )


def _runs(ctx: RankContext, root: str) -> dict[str, Any]:
    from plug_data import Digits

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.prefix import FrozenPrefix

    read: list[tuple[str, str, bool]] = []  # (dtype read, dtype the stage expects, read from the cache)
    frozen_prefix = FrozenPrefix.forward

    def recorded(self: FrozenPrefix, x: Any, ids: Any) -> Any:
        out = frozen_prefix(self, x, ids)
        if self.frozen and out is not None:
            expected = self.ctx.prefix_example(self.frozen).dtype
            read.append((str(out.dtype), str(expected), self.cache_on))
        return out

    FrozenPrefix.forward = recorded  # type: ignore[method-assign]
    out: dict[str, Any] = {}
    runs = (
        ("off", {"cache": "off"}),
        ("auto", {"cache": "on"}),
        ("bf16", {"cache": "on", "cache_dtype": "bfloat16"}),
        ("bf16_disk", {"cache": "on", "cache_dtype": "bfloat16", "cache_tiers": {"device": 0, "disk": root}}),
    )
    for name, pipeline in runs:
        read.clear()
        with ElasticTrainer(_config(**pipeline), data=Digits(SAMPLES), quiet=True) as trainer:
            result = trainer.fit().to_dict()
            cache, stage = trainer.prefix.cache, trainer.stage
            out[name] = {
                "losses": result["losses"],
                "epochs": [(e["cache"], e["cache_hits"], e["cache_misses"]) for e in result["epochs"]],
                "reads": sorted(set(read)),
                "reason": trainer.prefix.report.reason,
                "tiers": [] if cache is None else [(t.name, t.used_bytes, t.entries) for t in cache.stats.tiers],
            }
            if cache is not None:
                frozen = stage.layout.frozen
                entry = cache.get(trainer.ctx.host_ids[:4], frozen).values
                out[name]["stored"] = (str(entry.dtype), entry[0].numel() * entry.element_size())
                if name == "bf16_disk":
                    layouts = [SegmentLayout.parse(p.read_bytes()[:HEADER_BYTES]) for p in Path(root).glob("*.slab")]
                    out[name]["files"] = sorted({(str(v.dtype), v.entry_bytes) for v in layouts})
    FrozenPrefix.forward = frozen_prefix  # type: ignore[method-assign]
    return out


@pytest.mark.distributed
def test_bfloat16_entries_take_half_the_bytes_and_the_default_is_unchanged(tmp_path: Path) -> None:
    r = run_distributed(_runs, 1, str(tmp_path / "disk"), timeout=500)[0]
    off, auto, bf16, disk = r["off"], r["auto"], r["bf16"], r["bf16_disk"]
    # the default stores float32 entries, exactly: the losses of the run without the cache
    assert auto["losses"] == off["losses"]
    assert auto["stored"][0] == "torch.float32" and "stored as" not in auto["reason"]
    # bfloat16: half the bytes per entry and in the device tier, the same entries, the same hits
    for run in (bf16, disk):
        assert run["epochs"] == auto["epochs"] == [(False, 0, 0), (True, TRAIN, 0), (True, TRAIN, 0)]
        assert run["stored"] == ("torch.bfloat16", auto["stored"][1] // 2)
        assert "entries stored as bfloat16" in run["reason"] and "read as float32" in run["reason"]
        assert all(math.isfinite(loss) for loss in run["losses"])
        # close to the exact run, but the rounding shows: no longer bit-identical
        assert run["losses"] == pytest.approx(off["losses"], rel=2e-2)
        assert run["losses"] != off["losses"]
    (name, used, entries), (_, used_auto, entries_auto) = bf16["tiers"][0], auto["tiers"][0]
    assert name == "device" and entries == entries_auto == TRAIN and used * 2 == used_auto
    assert disk["files"] == [("torch.bfloat16", disk["stored"][1])]
    assert bf16["losses"] == disk["losses"]  # the tier does not change the values
    # what a step hands the next stage is the dtype that stage expects, read from the cache or not
    for run in (auto, bf16, disk):
        assert {got for got, _, _ in run["reads"]} == {want for _, want, _ in run["reads"]} == {"torch.float32"}
        assert any(on for _, _, on in run["reads"])
