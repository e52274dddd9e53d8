"""How fast the disk-data benchmark's loader delivers images, apart from the model (issue #18).

    python benchmarks/gpu/bench_loader_gpu.py --data /tmp/images.npy --out $OUT/loader.json
    python benchmarks/gpu/bench_loader_gpu.py --tiny --out /tmp/loader.json      # CPU smoke run

``bench_disk_data_gpu.py``'s two loader-bound epochs (nothing cached yet) deliver about 2,200 images/s with 8
workers, below the model's pace. This times the same ``DataLoader`` over the same ``DiskImages`` file with nothing
else running, varying one thing at a time, to say which part bounds it:

* ``workers``: the worker count (decode and normalise run in the workers);
* ``pin``: ``pin_memory`` (the training process's pin thread copies each 308 MB float32 batch into page-locked
  memory) or not;
* ``to_device``: each batch copied to the GPU (``non_blocking`` when pinned) and the device synchronised, as a
  training step would wait for it, or left on the host;
* ``dtype``: what the transform returns (float32, or bfloat16 at half the bytes);
* ``collate``: torch's ``default_collate`` over the dataset, or elastic_pipe's own reading of a dataset split
  (its items as ``(index, item)`` pairs and its checking collate step, as ``DatasetSplit`` reads them).

Also the per-image decode time in this process (one thread) and the stack of one batch, for scale. Each
setting reads ``--batches`` batches after ``--warmup`` batches (the workers' start and the first batches are not
the steady rate; reported apart as ``first_batch_s``).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

import torch

from _report import emit  # this folder
from bench_disk_data_gpu import INPUT_DTYPES, DiskImages, write_images  # this folder
from elastic_pipe.orchestrator.data.items import Collate, Items, item_spec

#: ``(workers, pin, to_device, dtype, collate)`` per setting; ``W`` stands for the largest ``--workers`` count.
SETTINGS: tuple[tuple[str, bool, bool, str, str], ...] = (
    ("8", True, True, "float32", "torch"),
    ("8", False, False, "float32", "torch"),
    ("8", True, False, "float32", "torch"),
    ("8", True, True, "float32", "elastic"),
    ("W", True, True, "float32", "torch"),
    ("W", False, False, "float32", "torch"),
    ("8", True, True, "bfloat16", "torch"),
    ("W", True, True, "bfloat16", "torch"),
    ("W", True, True, "bfloat16", "elastic"),
)


def _loader(dataset: DiskImages, batch: int, workers: int, pin: bool, collate: str) -> Any:
    if collate == "torch":
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=pin, drop_last=True
        )
    spec = item_spec(dataset)
    items = Items(dataset, torch.arange(len(dataset)))
    order = torch.randperm(len(dataset)).tolist()
    lists = [order[i : i + batch] for i in range(0, len(order) - batch + 1, batch)]
    check = Collate(spec, spec.input_dtype, inputs=True, labels=True)
    return torch.utils.data.DataLoader(
        items,
        batch_sampler=lists,  # type: ignore[arg-type]  # any iterable of index lists works
        num_workers=workers,
        collate_fn=check,
        pin_memory=pin,
    )


def _rate(
    dataset: DiskImages,
    batch: int,
    workers: int,
    *,
    pin: bool,
    to_device: bool,
    collate: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    device = torch.device("cuda") if to_device else None
    loader = _loader(dataset, batch, workers, pin, collate)
    t_start = time.perf_counter()
    first = warm_end = None
    seen = 0
    for i, (x, _) in enumerate(itertools.islice(loader, args.warmup + args.batches)):
        if device is not None:
            x.to(device, non_blocking=pin)
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        if i == 0:
            first = now - t_start
        if i == args.warmup - 1:
            warm_end = now
        elif i >= args.warmup:
            seen += x.shape[0]
    elapsed = time.perf_counter() - (warm_end if warm_end is not None else t_start)
    return {
        "workers": workers,
        "pin": pin,
        "to_device": to_device,
        "dtype": str(dataset.dtype).removeprefix("torch."),
        "collate": collate,
        "first_batch_s": first,
        "images_per_s": seen / elapsed if elapsed > 0 else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/tmp/images.npy"), help="the images file (made if absent)")
    ap.add_argument("--images", type=int, default=None, help="images in the file (default 50000; --tiny 256)")
    ap.add_argument("--size", type=int, default=None, help="image side (default 224; --tiny 32)")
    ap.add_argument("--batch", type=int, default=None, help="batch (default 512; --tiny 32)")
    ap.add_argument("--workers", type=int, default=None, help="the largest worker count (default 14; --tiny 2)")
    ap.add_argument("--batches", type=int, default=None, help="timed batches per setting (default 30; --tiny 3)")
    ap.add_argument("--warmup", type=int, default=None, help="batches read before timing (default 8; --tiny 1)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tiny = args.tiny
    n = args.images or (256 if tiny else 50000)
    size = args.size or (32 if tiny else 224)
    batch = args.batch or (32 if tiny else 512)
    most = args.workers or (2 if tiny else 14)
    args.batches = args.batches or (3 if tiny else 30)
    args.warmup = args.warmup or (1 if tiny else 8)
    cuda = torch.cuda.is_available()
    if not (cuda or tiny):
        raise SystemExit("needs a CUDA device (or --tiny)")
    args.data.parent.mkdir(parents=True, exist_ok=True)
    write_images(args.data, n, size, classes=1000)
    datasets = {name: DiskImages(args.data, dtype=dtype) for name, dtype in INPUT_DTYPES.items()}
    dataset = datasets["float32"]
    t0 = time.perf_counter()
    items = [dataset[i][0] for i in range(batch)]
    decode_s = (time.perf_counter() - t0) / batch
    t0 = time.perf_counter()
    torch.stack(items)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "images": n,
        "size": size,
        "batch": batch,
        "decode_ms_per_image_one_thread": decode_s * 1e3,
        "stack_ms_per_batch": (time.perf_counter() - t0) * 1e3,
        "settings": [],
    }
    for w, pin, to_device, dtype, collate in SETTINGS:
        if (pin or to_device) and not cuda:
            continue
        workers = most if w == "W" else min(int(w), most)
        row = _rate(datasets[dtype], batch, workers, pin=pin, to_device=to_device, collate=collate, args=args)
        report["settings"].append(row)
        print(row, flush=True)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
