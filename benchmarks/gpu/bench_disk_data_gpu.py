"""One GPU, images on disk: the activation cache in host memory against the cache on the device and a plain loop.

    python benchmarks/gpu/bench_disk_data_gpu.py --images 50000 --workers 8 --data /tmp/images.npy --out $OUT
    python benchmarks/gpu/bench_disk_data_gpu.py --tiny --out /tmp/disk-bench     # CPU smoke run: 256 x 32 px

The images are synthetic uint8 pixels in one ``np.memmap`` file (``N x 3 x 224 x 224``, 7.5 GB for 50,000; written
here in chunks by threads, each chunk from its own seeded generator, so the file is the same on every run) with
random labels; a map-style dataset decodes one (uint8 -> float32, normalised with fixed per-channel statistics) per
``__getitem__``, in the ``DataLoader``'s worker processes, and exposes its labels as ``targets`` (what a step that
needs only labels reads). Arms, each in a fresh process (so that each one's peak host memory is its own), from the
same initial weights, with the same global batch (512), optimizer (AdamW, fused on a GPU), bf16 autocast, 10
epochs, eager:

* ``host_cache``: elastic_pipe on the dataset read from the file by ``--workers`` loader workers, alpha = 1/3,
  ``cache = "auto"`` with ``cache_tiers = { device = <a quarter of the cache>, host = <the rest>, host_kind =
  "pinned" }``: three quarters of the frozen prefix's outputs live in page-locked host memory;
* ``device_cache``: the same training with the images decoded once into device memory (a map-style dataset of
  device rows, :class:`DeviceImages`, read in the training process) and the whole cache in device memory: the
  fastest the cache can be;
* ``plain``: a plain PyTorch ``DataLoader`` (shuffled, ``--workers`` workers, pinned memory, persistent workers,
  prefetch) over the same file, and the eager training loop of the whole model (no freezing);
* ``host_cache_on`` (not run unless named in ``--arms``): ``host_cache`` with ``cache = "on"`` (read the cache
  from the first frozen epoch, whatever the measured pay-off says);
* ``file_device_cache`` (not run unless named): the images from the file through the loader, as ``host_cache``
  reads them, and the whole cache in device memory, as ``device_cache`` keeps it: what the loader alone costs.

On a GPU, a process of its own first runs three steps of the model on random images (``warmup_s``), outside every
arm's time: the machine's first use of CUDA (the driver's start, the CUDA libraries read from a cold disk) would
otherwise fall into the first arm's first step alone.

Targets: ``host_cache`` within 15% of ``device_cache``, and 2.5x or more faster than ``plain``. Each arm reports
its wall time (model on the device to the last step; elastic_pipe's evaluations and transitions included, the plain
loop evaluates nothing), per-epoch seconds, peak host memory (the main process's peak RSS, and the sampled peak of
the main process plus its loader workers, in which file pages a worker touched count once per worker), and peak
device memory (``torch.cuda.max_memory_allocated``/``reserved``). Every arm prints a line per epoch as it goes.
The results JSON (``--name``, under ``--out``) is rewritten after each arm; ``--budget-s`` bounds the whole run: an
arm still running when it is spent is stopped and recorded with the epochs it finished (so one device call of at
most 600 s always leaves a JSON). ``--arms`` splits the arms over several calls (each then writes its own
``--name``). ``--cache-dtype`` (default ``auto``: the prefix output's float32) is both elastic arms' ``[pipeline]
cache_dtype``; their tiers are sized by the stored entry, so ``bfloat16`` keeps the same split over the tiers in
half the bytes (``cache_entry_bytes`` is the stored entry's, ``prefix_output_bytes`` the output's).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import provenance  # this folder

#: ``--cache-dtype``: the values of ``[pipeline] cache_dtype``.
CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")
ARMS = ("plain", "device_cache", "host_cache", "host_cache_on", "file_device_cache")
#: What runs unless ``--arms`` says otherwise: the arms the targets compare, the slowest last.
DEFAULT_ARMS = ("host_cache", "device_cache", "plain")
ALPHA = 1 / 3
#: Per-channel statistics the dataset's transform normalises with (those of uniform uint8 pixels / 255).
MEAN, STD = 0.5, 0.2887
#: Share held out for evaluation by elastic_pipe (the plain loop trains on the same number of images).
EVAL_FRACTION = 0.05
#: The per-epoch step phases kept from elastic_pipe's epoch records.
PHASE_KEYS = ("data_s", "forward_s", "backward_s", "optimizer_s", "first_step_s")
#: ``--input-dtype``: what the dataset's transform returns.
INPUT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Images written per chunk when the file is generated (bounds the generator's memory).
WRITE_CHUNK = 2048


# --------------------------------------------------------------------------------------------------- the data
#: Classes of the images :func:`write_images` makes (the model's head may have more outputs).
CLASSES = 10
#: The class templates' blocks: one ViT-B/16 patch.
TEMPLATE_BLOCK = 16


def write_images(path: Path, n: int, size: int, classes: int, *, seed: int = 0) -> None:
    """``n`` uint8 images ``3 x size x size`` a model can learn to classify into ``path`` (a memmap), their labels
    beside it: each image is noise in ``[0, 127]`` plus its class's template in ``[0, 128]``, a fixed random pattern
    constant over each :data:`TEMPLATE_BLOCK`-pixel block (one value per ViT-B/16 patch), so the label is a
    function of the image (chance accuracy ``1 / classes``).

    Chunk ``c`` of :data:`WRITE_CHUNK` images comes from its own generator (``SeedSequence(seed)``'s ``c``-th
    child) as raw 64-bit words, so the chunks are written in parallel by threads (the generator releases the GIL)
    and the file does not depend on the thread count. A file of the right shape is kept.
    """
    labels_path = path.with_suffix(".labels.npy")
    if (
        path.exists()
        and labels_path.exists()
        and np.load(path, mmap_mode="r").shape == (n, 3, size, size)
        and np.load(labels_path).shape == (n,)
    ):
        return
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n, dtype=np.int64)
    block = TEMPLATE_BLOCK if size % TEMPLATE_BLOCK == 0 else 1
    coarse = rng.integers(0, 129, size=(classes, 3, size // block, size // block), dtype=np.uint8)
    templates = coarse.repeat(block, axis=2).repeat(block, axis=3)
    images = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n, 3, size, size))
    starts = list(range(0, n, WRITE_CHUNK))
    seeds = np.random.SeedSequence(seed).spawn(len(starts))
    per_image = 3 * size * size

    def fill(c: int) -> None:
        lo, hi = starts[c], min(n, starts[c] + WRITE_CHUNK)
        words = np.random.PCG64(seeds[c]).random_raw(-(-(hi - lo) * per_image // 8))
        noise = words.view(np.uint8)[: (hi - lo) * per_image].reshape(hi - lo, 3, size, size) >> 1
        images[lo:hi] = noise + templates[labels[lo:hi]]

    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        list(pool.map(fill, range(len(starts))))
    images.flush()
    np.save(labels_path, labels)


def normalise(pixels: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 pixels as float32 ``(p / 255 - MEAN) / STD``, in one new tensor (the rest in place: a per-item
    transform that allocates one 600 KB tensor instead of four keeps the loader workers out of the allocator),
    then rounded to ``dtype`` (bfloat16: what bf16 autocast rounds the first layer's input to anyway, at half the
    bytes through the loader and the host-to-device copy)."""
    return pixels.float().sub_(255.0 * MEAN).div_(255.0 * STD).to(dtype)  # no copy when dtype is float32


class DiskImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The images of :func:`write_images`, decoded and normalised one at a time (the file is opened lazily, in
    each loader worker)."""

    def __init__(self, path: Path, n: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.path = path
        self.dtype = dtype
        self.labels = np.load(path.with_suffix(".labels.npy"))
        self.n = len(self.labels) if n is None else n
        self.targets = self.labels[: self.n]  # every item's label, read without decoding (elastic_pipe's data.md)
        self._images: np.ndarray[Any, Any] | None = None

    def __len__(self) -> int:
        return self.n

    def images(self) -> np.ndarray[Any, Any]:
        if self._images is None:
            self._images = np.load(self.path, mmap_mode="r")
        return self._images

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels = torch.from_numpy(np.array(self.images()[index]))  # one copy out of the file
        return normalise(pixels, self.dtype), int(self.labels[index])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_images": None}  # each worker maps the file itself


class DeviceImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Every image decoded the dataset's way, held in device memory: item ``i`` is a view of row ``i``.

    A map-style dataset rather than samples held in memory (``inputs``/``labels``/``sample_ids``), because the
    runtime standardises samples held in memory through float64 copies of the whole input tensor, which at 50,000
    images (30 GB of float32) would not fit in one H200's memory. The inputs are already normalised, as the file
    dataset's are.
    """

    def __init__(self, dataset: DiskImages, device: torch.device) -> None:
        n = len(dataset)
        images = dataset.images()
        self.inputs = torch.empty((n, *images.shape[1:]), dtype=dataset.dtype, device=device)
        for start in range(0, n, WRITE_CHUNK):
            chunk = torch.from_numpy(np.array(images[start : min(n, start + WRITE_CHUNK)])).to(device)
            self.inputs[start : start + chunk.shape[0]] = normalise(chunk, dataset.dtype)
        self.targets = dataset.targets

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.inputs[index], int(self.targets[index])


# --------------------------------------------------------------------------------------------------- memory
class PeakRSS:
    """Samples the resident memory of this process and its children (the loader workers) until stopped."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def _children(self, pid: int) -> list[int]:
        found = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
        return found

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            self.peak_tree = max(self.peak_tree, sum(self._rss(p) for p in [me, *self._children(me)]))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------------- the arms
def build_model(preset: str, size: int) -> torch.nn.Module:
    """``vit-b16`` (ViT-B/16, 1000 classes) or ``tiny`` (a 3-block ViT-tiny, patch 8, 10 classes)."""
    from elastic_pipe import models

    if preset == "tiny":
        return models.vit("vit-tiny", image_size=size, patch_size=8, in_channels=3, num_classes=10, depth=3)
    return models.vit("vit-b16")


def progress(arm: str, **fields: Any) -> None:
    """One progress line for the parent (which prints it and keeps the last ones if the arm is stopped)."""
    print("PROGRESS " + json.dumps({"arm": arm, **fields}), flush=True)


def plain_arm(dataset: DiskImages, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """A plain ``DataLoader`` over the file and the eager loop of the whole model."""
    from elastic_pipe.orchestrator.data import cross_entropy

    n_train = len(dataset) - max(1, round(len(dataset) * EVAL_FRACTION))
    train = torch.utils.data.Subset(dataset, range(n_train))
    workers = args.workers
    loader = torch.utils.data.DataLoader(
        train,
        batch_size=args.batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
        generator=torch.Generator().manual_seed(0),
    )
    model = build_model(args.model_preset, args.size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    epoch_s: list[float] = []
    _sync(device)
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for epoch in range(args.epochs):
        te = time.perf_counter()
        for images, labels in loader:
            # the parameters' dtype once on the device (bfloat16 items cross at half the bytes)
            x = images.to(device, non_blocking=True).float()
            y = labels.to(device, non_blocking=True)
            with autocast:
                loss = cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(device)
        epoch_s.append(time.perf_counter() - te)
        progress("plain", epoch=epoch, seconds=epoch_s[-1], elapsed=time.perf_counter() - t0, loss=float(loss))
    total = time.perf_counter() - t0
    held_out = torch.utils.data.Subset(dataset, range(n_train, len(dataset)))
    return {
        "total_s": total,
        "epoch_seconds": epoch_s,
        "final_loss": float(loss),
        "final_accuracy": held_out_accuracy(model, held_out, args.batch, device),
    }


@torch.no_grad()
def held_out_accuracy(
    model: torch.nn.Module,
    held_out: torch.utils.data.Dataset[tuple[torch.Tensor, int]],
    batch: int,
    device: torch.device,
) -> float:
    """Top-1 accuracy of ``model`` on ``held_out`` (bf16 autocast on a GPU, eval mode; after the timed run)."""
    model.eval()
    right = total = 0
    for images, labels in torch.utils.data.DataLoader(held_out, batch_size=batch):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(images.to(device).float())
        right += int((logits.argmax(-1).cpu() == labels).sum())
        total += len(labels)
    model.train()
    return right / max(total, 1)


class EpochProfile:
    """``torch.profiler`` over one epoch of an elastic arm (``--profile-epoch``): the epoch's steps, its evaluation
    and the transition after it; the operators' totals, by host time and by device time, go to ``path``."""

    def __init__(self, epoch: int, path: Path) -> None:
        self.epoch = epoch
        self.path = path
        self._prof: Any = None

    def after(self, epochs_done: int) -> None:
        """Called with the epochs finished so far (0 before the first): starts or stops the profile."""
        if self._prof is not None and epochs_done == self.epoch + 1:
            self._prof.stop()
            averages = self._prof.key_averages()
            tables = [f"# epoch {self.epoch}, its evaluation and the transition after it"]
            for key in ("self_cpu_time_total", "self_cuda_time_total"):
                tables += [f"## by {key}", averages.table(sort_by=key, row_limit=40)]
            self.path.write_text("\n".join(tables) + "\n", encoding="utf-8")
            self._prof = None
        elif self._prof is None and epochs_done == self.epoch:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            # acc_events: keep the events of the whole window (torch 2.11 warns that a cycle clears them otherwise)
            self._prof = torch.profiler.profile(activities=activities, acc_events=True)
            self._prof.start()


def elastic_arm(arm: str, dataset: DiskImages, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """elastic_pipe with alpha = 1/3 and the cache: on the dataset from disk (host tier), or in device memory."""
    from elastic_pipe import cache as acache
    from elastic_pipe.cache import segments
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    host = arm.startswith("host_cache")
    from_file = arm != "device_cache"
    segments.HOST_READS = args.host_reads
    model = build_model(args.model_preset, args.size)
    example = torch.zeros((1, 3, args.size, args.size))
    with torch.no_grad():  # one entry: the prefix output's size is the same at every boundary of a ViT
        numel = model.children().__next__()(example).numel()
    output = torch.float32  # under bf16 autocast too (the residual stream)
    entry = numel * acache.stored_dtype(output, acache.parse_storage_dtype(args.cache_dtype)).itemsize
    n_train = len(dataset) - max(1, round(len(dataset) * EVAL_FRACTION))
    cache_bytes = entry * n_train
    tiers: dict[str, Any] = {"device": 2 * cache_bytes}
    if host:
        tiers = {"device": cache_bytes // 4, "host": cache_bytes, "host_kind": "pinned"}
    config = config_from_tables(
        {
            "model": {"name": "vit"},  # labels the run; the model itself is passed in
            "data": {"eval_fraction": EVAL_FRACTION, "workers": args.workers if from_file else 0, "check": False},
            "train": {
                "epochs": args.epochs,
                "global_batch": args.batch,
                "optimizer": "adamw",
                "lr": 1e-4,
                "autocast": "bf16" if device.type == "cuda" else "none",
                "compile": "off",
            },
            "freeze": {"policy": "alpha", "options": {"alpha": ALPHA}},
            "pipeline": {
                "pipe_len": 1,
                "microbatches": 1,
                "cache": "on" if arm == "host_cache_on" else "auto",
                "cache_tiers": tiers,
                "cache_dtype": args.cache_dtype,
            },
            "log": {"progress": False, "eval_every": args.eval_every},
        }
    )
    data = dataset if from_file else DeviceImages(dataset, device)
    reasons: list[str] = []
    elapsed: list[float] = []  # from fit's start to each epoch's end (its evaluation and transition included)
    profile = (
        EpochProfile(args.profile_epoch, Path(args.out) / f"profile_{arm}.txt") if args.profile_epoch >= 0 else None
    )
    t0 = time.perf_counter()

    def on_epoch_end(t: Any) -> None:
        reasons.append(t.prefix.report.reason)
        elapsed.append(time.perf_counter() - t0)
        if profile is not None:
            profile.after(len(t.result.epochs))
        e = t.result.epochs[-1]
        last = t.result.transitions[-1]["seconds"] if t.result.transitions else 0.0
        progress(
            arm,
            epoch=len(t.result.epochs) - 1,
            seconds=e["seconds"],
            elapsed=time.perf_counter() - t0,
            frozen_units=e["frozen_units"],
            cache=e["cache"],
            cache_hits=e["cache_hits"],
            transitions=len(t.result.transitions),
            last_transition_s=last,
        )

    with ElasticTrainer(config, model=model, data=data, quiet=True) as trainer:
        if profile is not None:
            profile.after(0)
        result = trainer.fit(on_epoch_end=on_epoch_end).to_dict()
        stats = trainer.prefix.cache.stats.to_dict() if trainer.prefix.cache is not None else {}
    epochs = result["epochs"]
    return {
        "total_s": result["seconds"],
        "epoch_seconds": [e["seconds"] for e in epochs],
        "frozen_units": [e["frozen_units"] for e in epochs],
        "cache": [e["cache"] for e in epochs],
        "cache_hits": [e["cache_hits"] for e in epochs],
        "cache_misses": [e["cache_misses"] for e in epochs],
        "transition_seconds": [t["seconds"] for t in result["transitions"]],
        "transition_phases": [t["phases"] for t in result["transitions"]],
        # per step, means over the timed steps (which synchronise the device at each phase's edge)
        "epoch_phases": [{k: e[k] for k in PHASE_KEYS} for e in epochs],
        "elapsed_at_epoch_end": elapsed,
        "cache_tiers": tiers,
        "cache_entry_bytes": entry,
        "prefix_output_bytes": numel * output.itemsize,
        "cache_dtype": args.cache_dtype,
        "cache_stats": stats,
        "cache_reasons": reasons,
        "final_loss": result["losses"][-1],
        "final_accuracy": result["final_accuracy"],
    }


def warm_up(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """A few steps of the model on random images at the arms' batch, so that the job's first arm does not pay the
    machine's first use of CUDA (the driver's start, the CUDA libraries and the kernels the arms' shapes pick read
    from a cold disk: 2.6 s more in the first step of the first arm on a fresh H200 machine than in the same arm
    run next; still 1.2 s more after a warm-up at batch 64, ``gpu_1xh200_disk_data_cache_bf16_warm.json``)."""
    t0 = time.perf_counter()
    model = build_model(args.model_preset, args.size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
    classes = 10 if args.model_preset == "tiny" else 1000
    for _ in range(3):
        x = torch.randn(args.batch, 3, args.size, args.size, device=device).to(INPUT_DTYPES[args.input_dtype]).float()
        y = torch.randint(0, classes, (x.shape[0],), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    return {"seconds": time.perf_counter() - t0}


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """One arm in this process (a one-rank gloo group for elastic_pipe)."""
    import torch.distributed as dist

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if arm == "warmup":
        return warm_up(args, device)
    if arm != "plain":
        dist.init_process_group("gloo", rank=0, world_size=1)
        slab_log = logging.getLogger("elastic_pipe.cache.pinned")  # when the host slab is made, and how fast
        slab_log.setLevel(logging.DEBUG)
        slab_log.addHandler(logging.StreamHandler(sys.stderr))
    dataset = DiskImages(Path(args.data), args.images, INPUT_DTYPES[args.input_dtype])
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # CUDA initialised: torch 2.11 refuses to reset the stats before
        torch.cuda.reset_peak_memory_stats(device)
    with PeakRSS() as rss:
        out = plain_arm(dataset, args, device) if arm == "plain" else elastic_arm(arm, dataset, args, device)
    out["peak_rss_main_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["peak_rss_tree_bytes"] = rss.peak_tree
    if device.type == "cuda":
        out["peak_device_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_device_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    if dist.is_initialized():
        dist.destroy_process_group()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=None, help="images in the file (default 50000; --tiny: 256)")
    ap.add_argument("--size", type=int, default=None, help="image side in pixels (default 224; --tiny: 32)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default 10; --tiny: 3)")
    ap.add_argument("--batch", type=int, default=None, help="global batch (default 512; --tiny: 32)")
    ap.add_argument("--workers", type=int, default=None, help="loader workers (default min(8, cores - 2); --tiny: 1)")
    ap.add_argument("--model-preset", choices=("vit-b16", "tiny"), default=None, help="default vit-b16; --tiny: tiny")
    ap.add_argument(
        "--input-dtype",
        choices=tuple(INPUT_DTYPES),
        default="float32",
        help="what the dataset's transform returns, in every arm (bfloat16: half the bytes per image)",
    )
    ap.add_argument(
        "--cache-dtype",
        choices=CACHE_DTYPES,
        default="auto",
        help="[pipeline] cache_dtype of the elastic arms (auto: the prefix output's own; bfloat16: half the bytes)",
    )
    ap.add_argument(
        "--host-reads",
        choices=("mapped", "copies"),
        default="mapped",
        help="how a step reads the pinned host tier (elastic_pipe.cache.segments.HOST_READS): one gather kernel on "
        "the slab's device view, or one copy per run of slots",
    )
    ap.add_argument(
        "--eval-every",
        type=int,
        default=1,
        help="[log] eval_every of the elastic arms (default 1: after every epoch; any value: after the last one "
        "too); the plain loop evaluates nothing",
    )
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--data", default="", help="the images file (default: <out>/images.npy, generated if absent)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: 256 images of 32 px, a 3-block ViT")
    ap.add_argument("--budget-s", type=float, default=570.0, help="seconds for the whole run (arms then stop)")
    ap.add_argument(
        "--profile-epoch",
        type=int,
        default=-1,
        help="profile this epoch of each elastic arm (its steps, evaluation and transition): profile_<arm>.txt",
    )
    ap.add_argument("--name", default="", help="results file name (default: by device, and the arms if not all)")
    ap.add_argument("--arm", default="", help=argparse.SUPPRESS)  # internal: run one arm, print its JSON
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    tiny = {"images": 256, "size": 32, "epochs": 3, "batch": 32, "workers": 1, "model_preset": "tiny"}
    full = {"images": 50_000, "size": 224, "epochs": 10, "batch": 512, "model_preset": "vit-b16"}
    full["workers"] = max(1, min(8, (os.cpu_count() or 2) - 2))
    for key, value in (tiny if args.tiny else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        ap.error(f"--arms: unknown {unknown}, expected some of {', '.join(ARMS)}")
    args.arm_list = arms
    return args


def transparent_hugepage() -> dict[str, str]:
    """The kernel's transparent huge page settings (the pinned host slab's make time depends on them)."""
    found = {}
    for name in ("enabled", "defrag"):
        path = Path("/sys/kernel/mm/transparent_hugepage") / name
        found[name] = path.read_text(encoding="ascii").strip() if path.exists() else "unknown"
    return found


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    if args.arm:
        print("RESULT " + json.dumps(run_arm(args.arm, args)), flush=True)
        return 0
    t_start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else out / "images.npy"
    data.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing {args.images} images of {args.size} px to {data} ...", flush=True)
    write_images(data, args.images, args.size, CLASSES)
    write_s = time.perf_counter() - t_start
    print(f"images ready in {write_s:.1f} s ({data.stat().st_size / 1e9:.2f} GB)", flush=True)
    report: dict[str, Any] = {
        **provenance(),
        "labels": f"learnable: noise over one of {CLASSES} class templates (chance {1 / CLASSES:.2f})",
        "images": args.images,
        "image_size": args.size,
        "model": args.model_preset,
        "file_bytes": data.stat().st_size,
        "write_s": write_s,
        "epochs": args.epochs,
        "global_batch": args.batch,
        "workers": args.workers,
        "input_dtype": args.input_dtype,
        "cache_dtype": args.cache_dtype,
        "eval_every": args.eval_every,
        "host_reads": args.host_reads,
        "alpha": ALPHA,
        "budget_s": args.budget_s,
        "note": "the file is written in the same job, so its pages start warm in the OS page cache",
        "transparent_hugepage": transparent_hugepage(),
        "arms": {},
    }
    if torch.cuda.is_available():  # in a process of its own, as the arms run, and outside their times
        cmd = [sys.executable, __file__, "--arm", "warmup", "--out", str(out), f"--model-preset={args.model_preset}"]
        cmd += [f"--size={args.size}", f"--batch={args.batch}", f"--input-dtype={args.input_dtype}"]
        lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
        report["warmup_s"] = json.loads(next(x for x in lines if x.startswith("RESULT "))[7:])["seconds"]
        print(f"CUDA warmed up in a process of its own in {report['warmup_s']:.1f} s", flush=True)
    name = args.name or _default_name(args)
    for arm in args.arm_list:
        left = args.budget_s - (time.perf_counter() - t_start)
        if left < 5:
            report["arms"][arm] = {"error": f"not run: the budget of {args.budget_s:.0f} s was spent"}
            print(f"{arm}: not run, the budget is spent", flush=True)
            continue
        report["arms"][arm] = _run_arm_process(arm, args, data, out, left)
        r = report["arms"][arm]
        if "total_s" in r:
            print(
                f"{arm}: {r['total_s']:.1f} s (process {r['process_s']:.1f} s), epochs "
                f"{[round(x, 2) for x in r['epoch_seconds']]}, peak RSS {r['peak_rss_main_bytes'] / 2**30:.2f} GiB "
                f"(tree {r['peak_rss_tree_bytes'] / 2**30:.2f}), device "
                f"{r.get('peak_device_allocated_bytes', 0) / 2**30:.2f} GiB",
                flush=True,
            )
        _summarise(report)
        report["wall_s"] = time.perf_counter() - t_start
        (out / name).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k.startswith("host_cache_")}), flush=True)
    print(f"wrote {out / name} after {time.perf_counter() - t_start:.1f} s", flush=True)
    return 0


def _default_name(args: argparse.Namespace) -> str:
    base = "gpu_1xh200_disk_data" if torch.cuda.is_available() and not args.tiny else "disk_data_cpu"
    dtype = "" if args.cache_dtype == "auto" else f"_cache_{args.cache_dtype}"
    return base + dtype + ("" if tuple(args.arm_list) == DEFAULT_ARMS else "_" + "_".join(args.arm_list)) + ".json"


def _run_arm_process(arm: str, args: argparse.Namespace, data: Path, out: Path, timeout: float) -> dict[str, Any]:
    """Run one arm in a fresh process, printing its progress lines; stop it after ``timeout`` seconds."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, __file__, "--arm", arm, "--data", str(data), "--out", str(out)]
    cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("images", "size", "epochs", "batch", "workers")]
    cmd += [f"--model-preset={args.model_preset}", f"--input-dtype={args.input_dtype}"]
    cmd += [f"--cache-dtype={args.cache_dtype}", f"--eval-every={args.eval_every}", f"--host-reads={args.host_reads}"]
    cmd += [f"--profile-epoch={args.profile_epoch}"]
    log_path = out / f"{arm}.stderr.log"
    t_arm = time.perf_counter()
    epochs: list[dict[str, Any]] = []
    result: dict[str, Any] | None = None
    with open(log_path, "w", encoding="utf-8") as err:
        # its own session: a stop ends the arm's loader workers with it
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(child.pid, signal.SIGKILL))
        timer.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                if line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT ") :])
                elif line.startswith("PROGRESS "):
                    epochs.append(json.loads(line[len("PROGRESS ") :]))
                    fields = {k: round(v, 3) if isinstance(v, float) else v for k, v in epochs[-1].items()}
                    print(f"  {fields}", flush=True)
            code = child.wait()
        finally:
            timer.cancel()
    process_s = time.perf_counter() - t_arm
    if code == 0 and result is not None:
        return {**result, "process_s": process_s}
    tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
    stopped = code == -9 and process_s >= timeout - 1
    reason = f"stopped after {process_s:.0f} s (the budget)" if stopped else f"exit code {code}"
    print(f"{arm}: FAILED ({reason})\n{tail}", flush=True)
    return {"error": reason, "stderr_tail": tail, "process_s": process_s, "epochs_done": epochs}


def _summarise(report: dict[str, Any]) -> None:
    arms = report["arms"]
    ok = {k: v["total_s"] for k, v in arms.items() if "total_s" in v}
    if "host_cache" in ok and "device_cache" in ok:
        report["host_cache_over_device_cache"] = ok["host_cache"] / ok["device_cache"]
        report["host_cache_within_15pct"] = ok["host_cache"] <= 1.15 * ok["device_cache"]
    if "host_cache" in ok and "plain" in ok:
        report["host_cache_speedup_over_plain"] = ok["plain"] / ok["host_cache"]
        report["host_cache_at_least_2_5x"] = ok["plain"] >= 2.5 * ok["host_cache"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    raise SystemExit(main())
