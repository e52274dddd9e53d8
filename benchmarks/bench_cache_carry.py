"""CPU: seconds of a cache fill's writes and of the transition carry (``ActivationCache.extend``) of ViT-B/16
entries (197 x 768 float32, 605 KB each), in one thread; prints JSON.

    python benchmarks/bench_cache_carry.py --entries 1024

The carry runs a cheap transform (x 1.5), so what is timed is moving the entries, not the layers; the values are
checked after it.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from elastic_pipe import cache as acache

ENTRY = (197, 768)
CHUNK = 256


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = args.entries
    entry_bytes = ENTRY[0] * ENTRY[1] * 4
    cache = acache.ActivationCache(n, device_budget=n * entry_bytes + (1 << 20), device="cpu")
    ids = torch.arange(n)
    rows = torch.randn(CHUNK, *ENTRY, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for lo in range(0, n, CHUNK):
        cache.put(ids[lo : lo + CHUNK], 1, rows[: min(CHUNK, n - lo)])
    put_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cache.extend(1, 2, lambda v: v * 1.5)
    extend_s = time.perf_counter() - t0
    if not torch.equal(cache.get(ids[:CHUNK], 2).values, rows * 1.5):
        raise SystemExit("the carry changed the values")
    gb = n * entry_bytes / 1e9
    print(json.dumps({"entries": n, "GB": round(gb, 3), "put_s": round(put_s, 3), "extend_s": round(extend_s, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
