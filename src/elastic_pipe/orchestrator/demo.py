"""The embedded demo: a ViT on real digits in 2 CPU processes, trained twice - with freezing and without.

The elastic run freezes blocks on FreezeOut's schedule (``t0 = 0.5``) and, from the first freeze on, reads the
frozen prefix's output from the activation cache, so a frozen block costs neither its backward pass nor its
forward pass. The reference run is the same job without freezing (policy ``never``, no cache). Both use the same
seed, data order, global batch, learning-rate schedule and layout; the elastic run goes first, so any one-time
cost of the processes (allocator growth, the first collectives) is charged to it, not to the reference.

Why this setting, on a machine of 2 CPU cores:

* **2 processes, 1 stage x 2 replicas** (data parallel). One process per core: more would time-share the cores,
  and every gradient all-reduce would wait for the process descheduled last. One stage, because the model fits
  one process and a 2-stage pipeline on 2 cores only adds a bubble; what the speedup measures is then compute
  that freezing skips, not a layout the reference was denied.
* **A model big enough for compute to dominate**: width 256 with 4x4 patches (5 tokens per 8x8 digit), 6 blocks,
  3.2M parameters. Measured per step and process on this machine: forward ~23 ms, backward ~45-50 ms, the
  gradient all-reduce ~30-40 ms and AdamW ~20 ms; data and Python glue take under 1 ms. All four large parts
  scale with the active layers, so a frozen, cached block takes its share out of each of them.
* **FreezeOut with ``t0 = 0.5``**: no block freezes before half the run, block ``i`` at the fraction
  ``0.5 + 0.5 * i / 6`` of it, so each block that stops has had at least half the run to converge; frozen blocks
  by epoch are 0, 0, 0, 1, 3, 5. Measured here: 0.933 held-out accuracy against the reference's 0.944 (the runs
  are deterministic, so this does not vary between runs; a batch of 64, with half the updates, left a 2-3 point
  gap). The statistics-driven ``converged`` policy, with its patience of 3 intervals, froze nothing in 6 epochs.
  The schedule skips a quarter of the block-epochs (9 of 36), so the speedup is modest (at most 1.33x, 6 / 4.5
  epochs of work): what the schedule saves, minus the cache fills.

On a busy machine the timings drift with its load; the demo reports the epochs before the first freeze, which do
the same work in both runs, so that the drift is visible next to the speedup.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from elastic_pipe.orchestrator.components import epoch_steps
from elastic_pipe.orchestrator.config import TrainConfig, config_from_tables
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.launch import launch
from elastic_pipe.orchestrator.process_group import join_process_group
from elastic_pipe.orchestrator.worker import run_rank

__all__ = ["DEMO", "DIGITS_SAMPLES", "REFERENCE", "demo_config", "run_demo", "steps_per_epoch"]

#: scikit-learn's digits: 1,797 real 8x8 images (the demo's dataset).
DIGITS_SAMPLES = 1797

#: The demo's configuration, in the TOML's shape (``freeze.options.total_steps`` is filled in by
#: :func:`demo_config` from the epochs and the batch).
DEMO: dict[str, dict[str, Any]] = {
    # 4x4 patches: 5 tokens per 8x8 digit; width 256 so that a step's arithmetic outweighs its host cost.
    "model": {"name": "vit", "options": {"preset": "vit-tiny", "patch_size": 4, "dim": 256, "mlp_dim": 512}},
    "data": {"dataset": "digits"},
    "train": {
        "epochs": 6,
        # 32 samples a step: 44 steps an epoch, enough updates for the reference to pass 95% in 6 epochs.
        "global_batch": 32,
        "optimizer": "adamw",
        "lr": 0.001,
        "warmup_steps": 10,
        "lr_schedule": "cosine",
    },
    "freeze": {"policy": "freezeout", "options": {"t0": 0.5}},
    "pipeline": {"pipe_len": 1, "solver": "greedy", "compression": "halving", "microbatches": 1, "cache": "on"},
    "launch": {"nproc_per_node": 2, "backend": "gloo"},
    "log": {"progress": True},
}

#: The reference run: the same job without freezing (so without a frozen prefix to cache).
REFERENCE: dict[str, Any] = {"freeze.policy": "never", "freeze.options": {}, "pipeline.cache": "off"}


def steps_per_epoch(config: TrainConfig, samples: int = DIGITS_SAMPLES) -> int:
    """Optimizer steps per epoch of ``config`` on a dataset of ``samples`` (the trainer's own rule,
    :func:`.components.epoch_steps`).

    Raises:
        ConfigError: the global batch does not split over the layouts the job can reach.
    """
    steps = epoch_steps(config, samples)
    if steps is None:
        raise ConfigError(
            f"train.global_batch = {config.train.global_batch} does not split into equal micro-batches over the "
            "layouts the demo can reach"
        )
    return steps


def demo_config(overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """The demo's :class:`TrainConfig` with ``{"section.key": value}`` overrides applied.

    FreezeOut's ``total_steps`` is set from the resulting epochs and batch unless the overrides give it.
    """
    config = config_from_tables(DEMO, source="demo").override(dict(overrides or {}))
    options = dict(config.freeze.options)
    if config.freeze.policy == "freezeout" and "total_steps" not in options:
        options["total_steps"] = steps_per_epoch(config) * config.train.epochs
        config = config.override({"freeze.options": options})
    return config


def _demo_entry(tables: dict[str, Any], reference: bool) -> dict[str, Any]:
    config = config_from_tables(tables)
    join_process_group(config)
    try:
        out: dict[str, Any] = {"elastic": run_rank(config).to_dict()}
        if reference:
            if dist.get_rank() == 0:
                sys.stderr.write("--- the reference: the same run without freezing ---\n")
            out["baseline"] = run_rank(config.override(REFERENCE)).to_dict()
        return out
    finally:
        dist.destroy_process_group()


def run_demo(config: TrainConfig, *, baseline: bool = True) -> dict[str, Any]:
    """Launch the demo's processes and return rank 0's results (``{"elastic": ..., "baseline": ...}``).

    Args:
        config: the elastic run (see :func:`demo_config`).
        baseline: also train the no-freezing reference (:data:`REFERENCE`) in the same processes.
    """
    results = launch(config, _demo_entry, config.to_dict(), baseline)
    return dict(results[0])
