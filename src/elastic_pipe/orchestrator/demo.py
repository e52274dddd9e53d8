"""The embedded demo: a small ViT on real digits, 4 CPU processes, the pipeline going 4 -> 2 -> 1 as layers freeze.

Two runs in the same 4 processes: the elastic run (freeze, compress the pipeline, add replicas) and the same run
without reshaping (freeze only: the pipeline keeps 4 stages and 1 replica). Both use the same seed, data order,
global batch and learning-rate schedule; the freeze policy is the same, except that the fixed 4-stage pipeline
needs 4 active sub-layers, which caps how many blocks it may freeze.
"""

from __future__ import annotations

import sys
from typing import Any

import torch.distributed as dist

from elastic_pipe.orchestrator.config import TrainConfig, config_from_tables
from elastic_pipe.orchestrator.launch import launch
from elastic_pipe.orchestrator.process_group import join_process_group
from elastic_pipe.orchestrator.worker import run_rank

__all__ = ["DEMO", "demo_config", "run_demo"]

#: The demo's configuration, in the TOML's shape: ViT-tiny (6 blocks, 14 sub-layers) on the 8x8 digits, alpha = 1/3.
DEMO: dict[str, dict[str, Any]] = {
    # 4x4 patches: 5 tokens per 8x8 digit, which learns faster and runs ~6x cheaper than the preset's 2x2.
    "model": {"name": "vit", "options": {"preset": "vit-tiny", "patch_size": 4}},
    "data": {"dataset": "digits"},
    "train": {
        "epochs": 6,
        "global_batch": 64,
        "optimizer": "adamw",
        "lr": 0.006,
        "warmup_steps": 10,
        "lr_schedule": "cosine",
    },
    "freeze": {"policy": "alpha", "options": {"alpha": 1 / 3}},
    # 2 micro-batches per step: on CPU the host cost of each pipeline action dominates, not the bubble.
    "pipeline": {"pipe_len": 4, "solver": "greedy", "compression": "halving", "microbatches": 2},
    "launch": {"nproc_per_node": 4, "backend": "gloo"},
    "log": {"progress": True},
}


def demo_config(overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The demo's :class:`TrainConfig` with ``{"section.key": value}`` overrides applied."""
    return config_from_tables(DEMO, source="demo").override(overrides or {})


def _demo_entry(tables: dict[str, Any], baseline: bool) -> dict[str, Any]:
    config = config_from_tables(tables)
    join_process_group(config)
    try:
        out: dict[str, Any] = {"elastic": run_rank(config).to_dict()}
        if baseline:
            if dist.get_rank() == 0:
                sys.stderr.write("--- the same run without reshaping (freeze only, 4 stages, 1 replica) ---\n")
            fixed = config.override({"pipeline.compression": "none", "pipeline.cache": "off"})
            out["baseline"] = run_rank(fixed).to_dict()
        return out
    finally:
        dist.destroy_process_group()


def run_demo(config: TrainConfig, *, baseline: bool = True) -> dict[str, Any]:
    """Launch the demo's processes and return rank 0's results (``{"elastic": ..., "baseline": ...}``)."""
    results = launch(config, _demo_entry, config.to_dict(), baseline)
    return dict(results[0])
