"""One GPU: what a batch read from the pinned host tier of the activation cache costs, and how to make it cheaper.

    python benchmarks/gpu/bench_host_gather_gpu.py --out $OUT/host_gather.json

A pinned host slab of ViT-B/16 boundary entries (197 x 768 float32, 605 KB each; ``--entries``, 4 GB by default)
and batches of ``--batch`` random slots. Each variant is timed over ``--repeats`` batches after a warm-up (median
milliseconds per batch, the batch on the device and the host synchronised with it):

* ``gather``: ``torch.index_select`` into a pinned staging buffer (the cache's read as it is), host side only;
* ``h2d``: the staging buffer's copy to the device alone;
* ``gather_h2d``: the two in turn (what a read costs when nothing overlaps it);
* ``chunked_<k>``: the batch split into ``k`` slices, each gathered by one of ``k`` threads into its part of the
  staging buffer and copied to the device as soon as it is ready (gather and copy overlap);
* ``rows``: one copy per run of consecutive slots straight from the pinned slab to the device
  (:func:`elastic_pipe.cache.segments.copy_rows`, the cache's read where no device view exists): no host gather,
  the host only issues the copies (``rows_issue``: the host's time to issue them, without waiting for them);
* ``mapped``: one gather kernel on the pinned slab's device view (:func:`elastic_pipe.cache.pinned.device_view`,
  the cache's read with ``HOST_READS = "mapped"``): the kernel reads the rows over PCIe, the host launches one kernel
  (``mapped_issue``: the host's time to launch it);
* ``device_gather``: the same batch gathered from a slab on the device (the device tier's read, for scale);
* ``compute_alone``, ``compute_beside_rows``, ``compute_beside_mapped``: ``--matmuls`` bf16 matrix products on the
  current stream alone, and with a batch read (``rows`` or ``mapped``) on a side stream at the same time: what each
  read costs the compute it overlaps (a gather kernel holds streaming multiprocessors while it waits on PCIe; the
  copies run on the copy engines).

On the CPU (no GPU) only the host-side variants run, on a smaller slab.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from _report import emit  # this folder
from elastic_pipe.cache.pinned import device_view
from elastic_pipe.cache.segments import copy_rows

ENTRY = (197, 768)


def _time(fn, repeats: int, sync) -> float:  # type: ignore[no-untyped-def]
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(1000 * (time.perf_counter() - t0))
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=6600)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the entries' dtype")
    ap.add_argument("--matmuls", type=int, default=8, help="bf16 8192^2 products beside each read (compute_*)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    entries = args.entries if cuda else min(args.entries, 512)
    batch = min(args.batch, entries)
    dtype = getattr(torch, args.dtype)
    slab = torch.empty((entries, *ENTRY), dtype=dtype, pin_memory=cuda)
    slab.view(-1)[::4096].fill_(1.0)  # touch every page
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(entries, generator=gen)[:batch]
    staging = torch.empty((batch, *ENTRY), dtype=dtype, pin_memory=cuda)
    target = torch.empty((batch, *ENTRY), dtype=dtype, device=device)
    stream = torch.cuda.Stream() if cuda else None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def gather() -> None:
        torch.index_select(slab, 0, slots, out=staging)

    def h2d() -> None:
        target.copy_(staging, non_blocking=True)

    def chunked(k: int, pool: ThreadPoolExecutor):  # type: ignore[no-untyped-def]
        bounds = [(batch * i // k, batch * (i + 1) // k) for i in range(k)]

        def part(lo: int, hi: int) -> None:
            torch.index_select(slab, 0, slots[lo:hi], out=staging[lo:hi])

        def run() -> None:
            futures = [pool.submit(part, lo, hi) for lo, hi in bounds]
            for (lo, hi), f in zip(bounds, futures, strict=True):
                f.result()
                if stream is not None:
                    with torch.cuda.stream(stream):
                        target[lo:hi].copy_(staging[lo:hi], non_blocking=True)

        return run

    results: dict[str, object] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "entries": entries,
        "batch": batch,
        "dtype": args.dtype,
        "batch_MB": round(batch * ENTRY[0] * ENTRY[1] * dtype.itemsize / 1e6, 1),
        "ms": {},
    }
    ms: dict[str, float] = results["ms"]  # type: ignore[assignment]
    ms["gather"] = _time(gather, args.repeats, sync)
    if cuda:
        ms["h2d"] = _time(h2d, args.repeats, sync)
        ms["gather_h2d"] = _time(lambda: (gather(), h2d()), args.repeats, sync)
    for k in (2, 4, 8, 16):
        with ThreadPoolExecutor(k) as pool:
            ms[f"chunked_{k}"] = _time(chunked(k, pool), args.repeats, sync)
    one = torch.get_num_threads()
    torch.set_num_threads(1)
    ms["gather_1_thread"] = _time(gather, args.repeats, sync)
    with ThreadPoolExecutor(8) as pool:
        ms["chunked_8_1_thread_each"] = _time(chunked(8, pool), args.repeats, sync)
    torch.set_num_threads(one)
    if cuda:
        ms["rows"] = _time(lambda: copy_rows(slab, slots, target), args.repeats, sync)
        ms["rows_issue"] = _time(lambda: copy_rows(slab, slots, target), args.repeats, lambda: None)
        sync()
        dev_slab = slab.to(device)
        dev_slots = slots.to(device)
        ms["device_gather"] = _time(lambda: torch.index_select(dev_slab, 0, dev_slots, out=target), args.repeats, sync)
        del dev_slab
        view = device_view(slab, device)
        results["device_view"] = view is not None
        if view is not None:

            def mapped() -> None:
                torch.index_select(view, 0, dev_slots, out=target)

            ms["mapped"] = _time(mapped, args.repeats, sync)
            ms["mapped_issue"] = _time(mapped, args.repeats, lambda: None)
            sync()
            assert torch.equal(target.cpu(), slab[slots]), "the mapped gather read other rows"
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

        def compute() -> None:
            for _ in range(args.matmuls):
                a @ a

        def beside(read) -> None:  # type: ignore[no-untyped-def]
            assert stream is not None
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                read()
            compute()

        ms["compute_alone"] = _time(compute, args.repeats, sync)
        ms["compute_beside_rows"] = _time(lambda: beside(lambda: copy_rows(slab, slots, target)), args.repeats, sync)
        if view is not None:
            ms["compute_beside_mapped"] = _time(lambda: beside(mapped), args.repeats, sync)
    gb = batch * ENTRY[0] * ENTRY[1] * dtype.itemsize / 1e9
    results["GB_per_s"] = {k: round(gb / (v / 1000), 1) for k, v in ms.items() if not k.startswith("compute")}
    emit(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
