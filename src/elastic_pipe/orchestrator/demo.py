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

from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.launch import launch
from elastic_pipe.orchestrator.worker import join_process_group, run_rank

__all__ = ["DEMO", "demo_config", "run_demo"]

#: The demo's configuration: ViT-tiny (6 blocks, 14 sub-layers) on the 8x8 digits, alpha = 1/3.
DEMO: dict[str, Any] = {
    "model": "vit",
    # 4x4 patches: 5 tokens per 8x8 digit, which learns faster and runs ~6x cheaper than the preset's 2x2.
    "model_options": {"preset": "vit-tiny", "patch_size": 4},
    "dataset": "digits",
    "epochs": 6,
    "global_batch": 64,
    "optimizer": "adamw",
    "lr": 0.006,
    "warmup_steps": 10,
    "lr_schedule": "cosine",
    "policy": "alpha",
    "policy_options": {"alpha": 1 / 3},
    "pipe_len": 4,
    "solver": "greedy",
    "compression": "halving",
    # 2 micro-batches per step: on CPU the host cost of each pipeline action dominates, not the bubble.
    "microbatches": 2,
    "nproc_per_node": 4,
    "backend": "gloo",
    "progress": True,
}


def demo_config(**overrides: Any) -> TrainConfig:
    """The demo's :class:`TrainConfig` with ``overrides`` applied."""
    return TrainConfig(**{**DEMO, **overrides})


def _demo_entry(config_dict: dict[str, Any], baseline: bool) -> dict[str, Any]:
    config = TrainConfig(**config_dict)
    join_process_group(config)
    try:
        out: dict[str, Any] = {"elastic": run_rank(config).to_dict()}
        if baseline:
            if dist.get_rank() == 0:
                sys.stderr.write("--- the same run without reshaping (freeze only, 4 stages, 1 replica) ---\n")
            out["baseline"] = run_rank(config.replace(compression="none", cache="off")).to_dict()
        return out
    finally:
        dist.destroy_process_group()


def run_demo(config: TrainConfig, *, baseline: bool = True) -> dict[str, Any]:
    """Launch the demo's processes and return rank 0's results (``{"elastic": ..., "baseline": ...}``)."""
    results = launch(config, _demo_entry, config.to_dict(), baseline)
    return dict(results[0])
