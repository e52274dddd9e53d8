"""Elastic training from Python: a ViT on the digits, 2 CPU processes under a 40 MiB per-rank memory budget,
a 2-stage pipeline that compresses to 1 stage x 2 replicas as FreezeOut freezes blocks.

    python examples/train_digits.py

The same as ``elastic-pipe train --config examples/vit_digits.toml``, written out: build a validated
``TrainConfig`` from the TOML's tables, check it against the registries and the model (``preflight``), start
the processes with torchrun's elastic agent (``launch``) and print what rank 0 reports.
"""

from __future__ import annotations


def main() -> None:
    from elastic_pipe.orchestrator import config_from_tables, launch, preflight
    from elastic_pipe.orchestrator.worker import entry

    config = config_from_tables(
        {
            "model": {"name": "vit", "options": {"preset": "vit-tiny", "patch_size": 4, "dim": 256, "mlp_dim": 512}},
            "train": {
                "epochs": 6,
                "global_batch": 32,
                "optimizer": "adamw",
                "lr": 0.001,
                "lr_schedule": "cosine",
                "warmup_steps": 10,
            },
            "freeze": {"policy": "freezeout", "options": {"t0": 0.6}},
            "pipeline": {"pipe_len": 2, "memory_budget": "40MiB", "microbatches": 4, "cache": "on"},
            "launch": {"nproc_per_node": 2, "backend": "gloo"},
        }
    )
    facts = preflight(config)  # a bad configuration fails here, before any process starts
    print(f"model: {facts['sublayers']} sub-layers, {facts['units']} freezable blocks, {facts['params']} parameters")
    result = launch(config, entry, config.to_dict())[0]
    for t in result["transitions"]:
        print(f"before epoch {t['epoch'] + 1}: frozen {t['frozen_units']}, K={t['pipe_len']}, R={t['replicas']}")
    print(f"final accuracy {result['final_accuracy']:.3f}")


if __name__ == "__main__":
    main()
