"""One GPU: what the steps' fill of the activation cache costs, apart from the loader and the model.

    python benchmarks/gpu/bench_cache_fill_steps_gpu.py --out $OUT/cache_fill_steps.json

The tiers of ``bench_disk_data_gpu.py``'s ``host_cache`` arm (a quarter of the entries on the device, the rest in
pinned host memory; ViT-B/16 entries, 197 x 768 float32, 605 KB each), filled as a lone rank's steps fill it
(``cache = "auto"``): ``--steps`` batches of ``--batch`` shuffled sample ids, each ``put`` from a batch on the
device, the device synchronised after each (a step's put waits for its rows). Reports the seconds of each put (the
first ones create the device and host segments: the page-locked allocation), their sum, and, for scale, the
seconds of one page-locked allocation of the host tier's size alone and of a pass of device-to-host copies into it
(first touch, then again).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from _report import emit  # this folder
from elastic_pipe.cache import ActivationCache, CacheTiers

ENTRY = (197, 768)


def _empty_host_cache() -> None:
    """Give torch's cached pinned blocks back (so a later allocation is timed as a new one)."""
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def _timed_fill(arena: torch.Tensor, flat: torch.Tensor) -> float:
    """Seconds of a pass of device-to-host copies of ``flat`` into ``arena``."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for lo in range(0, arena.numel() - flat.numel() + 1, flat.numel()):
        arena[lo : lo + flat.numel()].copy_(flat)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def pin_alternatives(host_bytes: int, flat: torch.Tensor) -> dict[str, float]:
    """Other ways to page-lock ``host_bytes``: torch's pinned allocator in 1 GiB pieces (no rounding of the whole
    to a power of two), and pageable memory touched by torch's threads (``zero_``) then registered with
    ``cudaHostRegister``; each timed, then a pass of copies into it."""
    out: dict[str, float] = {}
    piece = 1 << 30
    t0 = time.perf_counter()
    pieces = [torch.empty(min(piece, host_bytes - lo), dtype=torch.uint8, pin_memory=True)
              for lo in range(0, host_bytes, piece)]  # fmt: skip
    out["pin_pieces_1GiB_s"] = time.perf_counter() - t0
    out["pin_pieces_d2h_s"] = sum(_timed_fill(p, flat) for p in pieces if p.numel() >= flat.numel())
    del pieces
    _empty_host_cache()
    t0 = time.perf_counter()
    arena = torch.empty(host_bytes, dtype=torch.uint8)
    arena.zero_()
    out["pageable_touch_s"] = time.perf_counter() - t0
    cudart = torch.cuda.cudart()
    t1 = time.perf_counter()
    rc = cudart.cudaHostRegister(arena.data_ptr(), host_bytes, 0)
    out["host_register_s"] = time.perf_counter() - t1
    out["host_register_rc"] = int(rc) if not isinstance(rc, tuple) else int(rc[0])
    out["host_register_is_pinned"] = float(arena.is_pinned())
    out["host_register_d2h_s"] = _timed_fill(arena, flat)
    cudart.cudaHostUnregister(arena.data_ptr())
    del arena
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=47500)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    cuda = torch.device("cuda")
    entry = ENTRY[0] * ENTRY[1] * 4
    total = entry * args.samples
    host_bytes = total - total // 4
    report: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    t0 = time.perf_counter()
    arena = torch.empty(host_bytes, dtype=torch.uint8, pin_memory=True)
    report["pin_alloc_s"] = time.perf_counter() - t0
    rows = torch.randn(args.batch, *ENTRY, device=cuda)
    flat = rows.view(torch.uint8).view(-1)
    for name in ("d2h_first_touch_s", "d2h_again_s"):
        report[name] = _timed_fill(arena, flat)
    del arena
    _empty_host_cache()  # the cache's own allocation must not reuse it
    report["d2h_GB"] = host_bytes / 1e9
    report.update(pin_alternatives(host_bytes, flat))

    cache = ActivationCache.from_tiers(args.samples, CacheTiers(total // 4, total, host_kind="pinned"), device=cuda)
    ids = torch.randperm(args.samples, generator=torch.Generator().manual_seed(0))
    puts = []
    for lo in range(0, args.samples, args.batch):
        batch = ids[lo : lo + args.batch]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cache.put(batch, 4, rows[: batch.numel()])
        torch.cuda.synchronize()
        puts.append(time.perf_counter() - t0)
    report["puts"] = len(puts)
    report["put_s_total"] = sum(puts)
    report["put_s_first_three"] = puts[:3]
    report["put_s_median"] = statistics.median(puts)
    report["put_s_max"] = max(puts)
    report["tiers"] = [(t.name, t.entries) for t in cache.stats.tiers]
    cache.close()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
