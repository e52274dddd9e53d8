"""AutoCache pay-off: reading a frozen prefix's output from each cache tier vs recomputing it, for 0..L frozen blocks
of the package's ViT (:func:`elastic_pipe.models.vit`) on CPU.

Run: ``python benchmarks/bench_cache.py`` (or ``nox -s bench``). Writes ``benchmarks/results/cache.json`` and
prints a table per model. Everything runs in this one process.

Per model and frozen count ``k`` (``k`` blocks; block 0 includes the patch embedding):

* ``recompute``: the frozen prefix ``model.slice(0, model.prefix_len(k))`` on one batch, under ``no_grad``;
* ``device`` / ``host`` / ``disk``: ``ActivationCache.get`` of that batch's boundary-``k`` outputs from a cache with
  only that tier (device = CPU memory here; host = a shared segment in ``/dev/shm``; disk = a checksummed segment
  file, read through the OS page cache, i.e. warm);
* ``per-sample``: the same batch read from the device tier one sample at a time (``get`` per id, then ``cat``),
  the pattern a batched cache avoids;
* the decision of :func:`elastic_pipe.cache.decide` per tier, and the threshold: the first ``k`` where reading is
  faster than recomputing.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from elastic_pipe.cache import ActivationCache, decide, payoff_threshold, time_call
from elastic_pipe.models import vit

RESULTS = Path(__file__).resolve().parent / "results" / "cache.json"
SEED = 0
#: Timed runs per measurement and untimed warm-up runs; the minimum is reported, since on a machine shared with
#: other work interference only ever adds time.
REPEATS = 7
WARMUP = 1
STATISTIC = "min"
#: One intra-op thread: reproducible on a shared 2-core machine (and the per-core cost is what scales).
THREADS = 1
#: Models: the demo ViT on 8x8 digits, and a ViT-Ti-like model (dim 192, 12 blocks) on 32x32 images.
MODELS: dict[str, dict[str, Any]] = {
    "vit-tiny (digits 8x8, dim 64, 6 blocks)": {"config": "vit-tiny", "overrides": {}, "batch": 128},
    "vit-ti32 (32x32, dim 192, 12 blocks)": {
        "config": "vit-tiny",
        "overrides": {"image_size": 32, "patch_size": 4, "in_channels": 3, "dim": 192, "depth": 12, "heads": 3}
        | {"mlp_dim": 768},
        "batch": 16,
    },
}
TIERS = ("device", "host", "disk")
COLUMNS = (*TIERS, "per_sample")
#: Generous per-tier budget: the benchmark measures reads, not spilling.
BUDGET = 1 << 30


def _time(fn: Any) -> float:
    return time_call(fn, repeats=REPEATS, warmup=WARMUP, statistic=STATISTIC)


def _per_sample_read(cache: ActivationCache, ids: torch.Tensor, boundary: int) -> torch.Tensor:
    return torch.cat([cache.get(i, boundary).values for i in ids.split(1)])


def _cache(tier: str, num: int, workdir: Path) -> ActivationCache:
    budgets = {f"{tier}_budget": BUDGET}
    return ActivationCache(num, disk_dir=workdir / "disk", **budgets)  # type: ignore[arg-type]


def bench_model(label: str, spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    model = vit(spec["config"], seed=SEED, **spec["overrides"]).eval()
    batch = spec["batch"]
    generator = torch.Generator().manual_seed(SEED)
    channels, side = spec["overrides"].get("in_channels", 1), spec["overrides"].get("image_size", 8)
    inputs = torch.randn(batch, channels, side, side, generator=generator)
    ids = torch.arange(batch)
    caches = {tier: _cache(tier, batch, workdir) for tier in TIERS}
    rows = []
    with torch.no_grad():
        for k in range(model.num_units + 1):
            prefix = model.slice(0, model.prefix_len(k)) if k else torch.nn.Identity()
            recompute = _time(lambda p=prefix: p(inputs))
            row: dict[str, Any] = {"frozen": k, "recompute_s": recompute}
            if k == 0:  # nothing frozen: the "prefix output" is the input itself, nothing to cache
                rows.append(row)
                continue
            values = prefix(inputs)
            row["entry_bytes"] = values[0].numel() * values.element_size()
            for tier, cache in caches.items():
                cache.put(ids, k, values)
                assert cache.get(ids, k).num_hits == batch
                read = _time(lambda c=cache, kk=k: c.get(ids, kk))
                decision = decide(read, recompute)
                row[f"{tier}_s"] = read
                row[f"{tier}_enabled"] = decision.enabled
                if k > 1:
                    cache.drop(k - 1)
            row["per_sample_s"] = _time(lambda c=caches["device"], kk=k: _per_sample_read(c, ids, kk))
            rows.append(row)
    for cache in caches.values():
        cache.unlink()
    recomputes = [r["recompute_s"] for r in rows]
    thresholds = {}
    for tier in COLUMNS:
        reads = [float("inf")] + [r[f"{tier}_s"] for r in rows[1:]]  # k=0 never pays
        thresholds[tier] = payoff_threshold(reads, recomputes)
    return {
        "model": label,
        "batch": batch,
        "layers": model.num_units,
        "rows": rows,
        "thresholds": thresholds,
    }


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f}"


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['model']}, batch {result['batch']}: milliseconds per batch (* = cache pays)")
    print(f"{'frozen':>6} {'recompute':>10} " + " ".join(f"{c:>10}" for c in COLUMNS))
    for row in result["rows"]:
        cells = [f"{row['frozen']:>6}", f"{_fmt_ms(row['recompute_s']):>10}"]
        for tier in COLUMNS:
            if f"{tier}_s" not in row:
                cells.append(f"{'-':>10}")
                continue
            pays = row[f"{tier}_s"] < row["recompute_s"]
            cells.append(f"{_fmt_ms(row[f'{tier}_s'])}{'*' if pays else ' ':>2}")
        print(" ".join(cells))
    print("threshold (first frozen count that pays): " + ", ".join(f"{t}={k}" for t, k in result["thresholds"].items()))


def main() -> None:
    """Run every model, write the JSON results and print the tables."""
    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    workdir = Path(tempfile.mkdtemp(prefix="bench_cache_"))
    try:
        results = [bench_model(label, spec, workdir) for label, spec in MODELS.items()]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    document = {
        "benchmark": "cache",
        "command": "python benchmarks/bench_cache.py",
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
        },
        "notes": "CPU only, one thread; device tier = CPU memory; disk reads are warm (OS page cache); "
        f"{STATISTIC} of {REPEATS} runs after {WARMUP} warm-up; the machine is shared with other work",
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    for result in results:
        print_table(result)
    print(f"\nwrote {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
