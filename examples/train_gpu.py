"""Elastic training on GPUs: NCCL training groups, a gloo control group, bf16 autocast, transition seconds.

Run one process per GPU with torchrun::

    torchrun --nproc-per-node 2 examples/train_gpu.py                    # ViT-tiny on the digits
    torchrun --nproc-per-node 2 examples/train_gpu.py --model vit-b16    # ViT-B/16 on random 224x224 images

Each epoch prints a summary line, each transition its seconds (the published system took ~17 s per transition).
The run starts as a pipeline over all GPUs and compresses to data parallelism as blocks freeze (alpha = 1/3).
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def main() -> None:
    import torch

    from elastic_pipe.orchestrator import config_from_tables, run_rank
    from elastic_pipe.orchestrator.data import Split

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="vit-tiny", choices=["vit-tiny", "vit-b16"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048, help="random images for vit-b16")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # The run as the tables of its TOML file (see examples/vit_digits.toml).
    tables: dict[str, dict[str, Any]] = {
        "model": {"name": "vit", "options": {"preset": "vit-tiny", "patch_size": 4}},
        "train": {
            "epochs": args.epochs,
            "autocast": "bf16" if torch.cuda.is_available() else "none",
            "optimizer": "adamw",
            "lr": 1e-3,
        },
        "freeze": {"policy": "alpha", "options": {"alpha": 1 / 3}},
        "pipeline": {"pipe_len": world},
        "launch": {"nproc_per_node": world},
    }
    samples = None
    if args.model == "vit-b16":
        # Random images stand in for ImageNet: the point is the speed of steps and transitions, not accuracy.
        gen = torch.Generator().manual_seed(0)
        n = args.samples
        samples = Split(
            torch.randn(n, 3, 224, 224, generator=gen), torch.randint(0, 1000, (n,), generator=gen), torch.arange(n)
        )
        tables["model"]["options"] = {"preset": "vit-b16"}
        tables["train"].update(global_batch=256)
        tables["pipeline"].update(microbatches=4)
    result = run_rank(config_from_tables(tables), samples=samples)
    if int(os.environ.get("RANK", "0")) == 0:
        for t in result.transitions:
            print(
                f"transition before epoch {t['epoch'] + 1}: K={t['pipe_len']} R={t['replicas']} "
                f"frozen {t['frozen_units']} moved {t['bytes_moved'] / 1e6:.1f} MB in {t['seconds']:.3f} s"
            )
        for e in result.epochs:
            print(f"epoch {e['epoch'] + 1}: {e['samples_per_s']:.0f} samples/s, loss {e['loss']:.4f}")


if __name__ == "__main__":
    main()
