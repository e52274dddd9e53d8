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


def main() -> None:
    import torch

    from elastic_pipe.orchestrator import TrainConfig, run_rank
    from elastic_pipe.orchestrator.workload import Split

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="vit-tiny", choices=["vit-tiny", "vit-b16"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048, help="random images for vit-b16")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    common = {
        "epochs": args.epochs,
        "policy": "alpha",
        "policy_options": {"alpha": 1 / 3},
        "pipe_len": world,
        "nproc_per_node": world,
        "autocast": "bf16" if torch.cuda.is_available() else "none",
        "optimizer": "adamw",
        "lr": 1e-3,
    }
    samples = None
    if args.model == "vit-tiny":
        config = TrainConfig(model="vit", model_options={"preset": "vit-tiny", "patch_size": 4}, **common)
    else:
        # Random images stand in for ImageNet: the point is the speed of steps and transitions, not accuracy.
        gen = torch.Generator().manual_seed(0)
        n = args.samples
        samples = Split(
            torch.randn(n, 3, 224, 224, generator=gen), torch.randint(0, 1000, (n,), generator=gen), torch.arange(n)
        )
        config = TrainConfig(
            model="vit", model_options={"preset": "vit-b16"}, global_batch=256, microbatches=4, **common
        )
    result = run_rank(config, samples=samples)
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
