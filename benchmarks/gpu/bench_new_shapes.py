"""What a batch of a size the process has not run yet costs: MiniLM-L6's forward (eval, no gradients) and training
step (forward and backward) at batch sizes met for the first time, against the same call repeated, under each
scaled-dot-product-attention backend choice.

Why: on one H100 the freeze study's loop, when it split batches into parts of changing sizes, paid 50-120 ms for
many such steps against about 12 ms for a whole batch (``docs/benchmarks.md``); the frozen-prefix caches now keep
every forward at the batch size. This measures the cost per new size directly, and whether the attention backend is
where it goes.

Per backend (``default``: what torch picks; ``no_cudnn``: flash, memory-efficient or math; ``math``: math only),
after a warm-up at ``--batch``: for each size in its own list (no two backends share a size, so none finds the
other's set-up), the first call's milliseconds and the median of ``--repeat`` later ones, for the eval forward and
for the training step, bf16 autocast, 128 word pieces of which the last quarter is padding (the mask the model
passes to the attention).

Run on one GPU (a few seconds; carry ``.device_site`` for the MiniLM weights; on the CPU it is a smoke test):

    python3 benchmarks/gpu/bench_new_shapes.py --out benchmarks/results/gpu_1xh100_new_shapes.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import emit, provenance  # this folder
from elastic_pipe.models import load_minilm
from elastic_pipe.models.minilm import MINILM_PAD_ID

#: Each backend's batch sizes: distinct, so no backend meets a size another one has set up.
SIZES = {"default": (17, 19, 23, 26), "no_cudnn": (13, 21, 27, 30), "math": (11, 25, 29, 31)}
BACKENDS = {
    "default": None,
    "no_cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "math": [SDPBackend.MATH],
}


def backend(name: str) -> AbstractContextManager[None]:
    """The attention backends ``name`` allows (``default``: torch's own choice)."""
    allowed = BACKENDS[name]
    return nullcontext() if allowed is None else sdpa_kernel(allowed)


def timed(call: Callable[[], None]) -> float:
    """Milliseconds of one ``call``, the device synchronised on both sides."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    call()
    sync()
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--batch", type=int, default=32, help="the warm-up batch size (the study's)")
    ap.add_argument("--seq", type=int, default=128, help="word pieces per sample (the last quarter padding)")
    ap.add_argument("--repeat", type=int, default=5, help="later calls per size, their median reported")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    opts = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test of the script
    model = load_minilm(num_classes=5).to(device)
    g = torch.Generator().manual_seed(0)

    def tokens(rows: int) -> torch.Tensor:
        ids = torch.randint(1000, 30000, (rows, opts.seq), generator=g)
        ids[:, opts.seq - opts.seq // 4 :] = MINILM_PAD_ID
        return ids.to(device)

    def forward(ids: torch.Tensor) -> Callable[[], None]:
        def call() -> None:
            model.eval()
            with torch.no_grad(), torch.autocast(device.type, torch.bfloat16):
                model(ids)

        return call

    def train_step(ids: torch.Tensor) -> Callable[[], None]:
        labels = torch.zeros(len(ids), dtype=torch.int64, device=device)

        def call() -> None:
            model.train()
            with torch.autocast(device.type, torch.bfloat16):
                loss = F.cross_entropy(model(ids).float(), labels)
            loss.backward()
            model.zero_grad(set_to_none=True)

        return call

    warm = tokens(opts.batch)
    results: dict[str, Any] = {}
    for name in BACKENDS:
        with backend(name):
            for _ in range(3):  # this backend's set-up at the warm-up size
                forward(warm)()
                train_step(warm)()
            rows: list[dict[str, Any]] = []
            for size in (opts.batch, *SIZES[name]):
                ids = tokens(size)
                row: dict[str, Any] = {"batch": size}
                for kind, make in (("forward", forward), ("train_step", train_step)):
                    call = make(ids)
                    first = timed(call)
                    later = statistics.median(timed(call) for _ in range(opts.repeat))
                    row[kind] = {"first_ms": round(first, 3), "later_ms": round(later, 3)}
                rows.append(row)
                print(f"{name:>8} batch {size:3d}: " + ", ".join(
                    f"{k} first {row[k]['first_ms']:.1f} ms, later {row[k]['later_ms']:.1f} ms"
                    for k in ("forward", "train_step")
                ), file=sys.stderr)  # fmt: skip
        results[name] = rows
    report = {
        "benchmark": "bench_new_shapes",
        "command": "python3 benchmarks/gpu/bench_new_shapes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        **provenance(),
        "settings": {
            "model": "all-MiniLM-L6-v2 + 5-way head",
            "seq": opts.seq,
            "padding": opts.seq // 4,
            "warm_batch": opts.batch,
            "repeat": opts.repeat,
            "autocast": "bf16",
        },
        "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
        "backends": results,
    }
    emit(report, opts.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
