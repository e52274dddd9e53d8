"""The embedded demo: a ViT on real digits in 2 CPU processes under a per-rank memory budget, trained twice - with
freezing, which reshapes the job, and without, in the best static configuration that fits the same budget.

The budget (``[pipeline] memory_budget = "40MiB"``, counted as the layout rule counts it: an active sub-layer's
weights, gradients and AdamW's two moments, a frozen one's weights) is below the model's whole training state
(48.4 MiB), so one process cannot hold the whole model at the start: 1 stage x 2 replicas does not fit, a 2-stage
pipeline (24.2 MiB a rank) does. The reference is that pipeline trained without freezing (policy ``never``, every
other key the same, the cache setting included, though with nothing frozen it has nothing to cache): on 2 processes
the only static configuration the budget allows. The elastic run starts as the same pipeline, freezes blocks on
FreezeOut's schedule and reads the frozen prefix's output from the activation cache; once half the blocks are
frozen, the active half fits the compute budget of one stage (the ``halving`` rule) and the frozen weights need no
gradients nor optimizer state, so the whole model fits one rank: the job compresses to 1 stage x 2 replicas. Both
runs use the same seed, data order, global batch and learning-rate schedule and agree exactly until the first
freeze. Each runs in processes of its own: run in the processes the elastic run had used, the reference took longer
than the elastic run for the same work (its epochs before the first freeze) in 5 of 6 measurements, which flattered
the speedup.

Why this setting, on a machine of 2 CPU cores:

* **2 processes**, one per core: more would time-share the cores, and every gradient all-reduce or pipeline send
  would wait for the process descheduled last.
* **A model big enough for compute to dominate**: width 256 with 4x4 patches (5 tokens per 8x8 digit), 6 blocks,
  3.2M parameters; the pipeline runs 4 micro-batches of 8 samples (GPipe), 1 stage x 2 replicas 16 samples a
  replica. Forward, backward, the optimizer and the gradient all-reduce all scale with the active layers, so a
  frozen, cached block takes its share out of each of them.
* **8 epochs, FreezeOut with ``t0 = 0.4``**, decisions after every epoch: block ``i`` stops at the fraction
  ``0.4 + 0.6 * i / 6`` of the run, so frozen blocks by epoch are 0, 0, 0, 0, 2, 3, 4, 5: the first 4 epochs train
  everything (the same work in both runs), epoch 5 runs the 2-stage pipeline over 4 active blocks, and the last 3
  epochs run as 1 stage x 2 replicas over 3, 2 and 1 active blocks. Where the time goes: a pipeline epoch of all 6
  blocks (each stage one core, a bubble of 1/5 with 4 micro-batches) took 1.5 s on idle cores; relative to it, epoch
  5 (2 frozen, still 2 stages) took about 70%, the compressed epochs about 47%, 32% and 18% (no bubble, the frozen
  blocks neither computed nor all-reduced), a transition about 10%; the schedule skips 14 of 48 block-epochs, so the
  run with freezing takes about 3/4 of the reference's time. The saving must outweigh the drift of a machine's load
  between the two runs, so the schedule compresses early enough for 3 of the 8 epochs to run compressed. Measured at
  8 epochs (the reference 0.944): ``t0 = 0.4`` 0.942, ``t0 = 0.5`` 0.944, ``t0 = 0.6`` 0.958 (compressed for 2
  epochs, skipping 9 block-epochs); at 6 epochs, ``t0 = 0.5`` ended 2 points below the reference, ``t0 = 0.6`` with
  a decision every 11 steps 1.7 points below and the default policy (``drift``), which froze all 6 blocks at once in
  epoch 4, 2.8 points below. The held-out set is 359 digits: a point is 3.6 of them.

On a busy machine the timings drift with its load; the demo reports the epochs before the first freeze, which do
the same work in both runs, so that the drift is visible next to the speedup.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch.distributed as dist

from elastic_pipe.orchestrator.components import build_model, epoch_steps
from elastic_pipe.orchestrator.config import TrainConfig, config_from_tables
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.launch import join_process_group, launch
from elastic_pipe.orchestrator.layout import initial_layout
from elastic_pipe.orchestrator.setup import candidate_pipe_lens, memory_budget, sublayer_costs
from elastic_pipe.orchestrator.worker import run_rank

__all__ = ["DEMO", "DIGITS_SAMPLES", "REFERENCE", "budget_report", "demo_config", "run_demo", "steps_per_epoch"]

#: scikit-learn's digits: 1,797 real 8x8 images (the demo's dataset).
DIGITS_SAMPLES = 1797

#: The demo's configuration, in the TOML's shape (``freeze.options.total_steps`` is filled in by
#: :func:`demo_config` from the epochs and the batch).
DEMO: dict[str, dict[str, object]] = {
    # 4x4 patches: 5 tokens per 8x8 digit; width 256 so that a step's arithmetic outweighs its host cost.
    "model": {"name": "vit", "options": {"preset": "vit-tiny", "patch_size": 4, "dim": 256, "mlp_dim": 512}},
    "data": {"dataset": "digits"},
    "train": {
        "epochs": 8,
        # 32 samples a step: 44 steps an epoch; the reference passes 95% after 6 epochs and ends at 94.4%.
        "global_batch": 32,
        "optimizer": "adamw",
        "lr": 0.001,
        "warmup_steps": 10,
        "lr_schedule": "cosine",
    },
    "freeze": {"policy": "freezeout", "options": {"t0": 0.4}},
    "pipeline": {
        "pipe_len": 2,
        # below the whole training state (48.4 MiB): the job starts as a 2-stage pipeline (24.2 MiB a rank)
        "memory_budget": "40MiB",
        "solver": "greedy",
        "compression": "halving",
        "microbatches": 4,
        "cache": "on",
    },
    "launch": {"nproc_per_node": 2, "backend": "gloo"},
    "log": {"progress": True},
}

#: The reference run: the same job without freezing, every other key the same. Under the demo's memory
#: budget it keeps the pipeline it starts with: the shortest that fits, the best static configuration the budget
#: allows.
REFERENCE: dict[str, object] = {"freeze.policy": "never", "freeze.options": {}}


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


def demo_config(overrides: Mapping[str, object] | None = None) -> TrainConfig:
    """The demo's :class:`TrainConfig` with ``{"section.key": value}`` overrides applied.

    FreezeOut's ``total_steps`` is set from the resulting epochs and batch unless the overrides give it.
    """
    config = config_from_tables(DEMO, source="demo").override(dict(overrides or {}))
    options = dict(config.freeze.options)
    if config.freeze.policy == "freezeout" and "total_steps" not in options:
        options["total_steps"] = config.train.run_steps(steps_per_epoch(config))
        config = config.override({"freeze.options": options})
    return config


def budget_report(config: TrainConfig) -> dict[str, object]:
    """What ``[pipeline] memory_budget`` allows at the start, as the layout rule counts it (no process is started:
    the model is built on the meta device).

    Returns:
        ``{"limit_bytes", "training_state_bytes", "start": [{"pipe_len", "replicas", "rank_bytes", "fits"}, ...]}``:
        the budget, the whole model's training state (weights, gradients, optimizer state) and, per reachable
        pipeline length (shortest first), the bytes its fullest rank holds at the start and whether they fit.

    Raises:
        ConfigError: the config sets no memory budget.
    """
    model = build_model(config, meta=True)
    memory = memory_budget(config, model)
    if memory is None:
        raise ConfigError("the demo's budget report needs [pipeline] memory_budget, got none")
    costs = sublayer_costs(model)
    start = []
    for k in sorted(candidate_pipe_lens(config)):
        layout, _ = initial_layout(
            costs, k, config.world_size, solver=config.pipeline.solver, microbatches=config.microbatches_for(k)
        )
        need = max(memory.stage_bytes(layout))
        start.append({"pipe_len": k, "replicas": layout.replicas, "rank_bytes": need, "fits": need <= memory.limit})
    return {"limit_bytes": memory.limit, "training_state_bytes": sum(memory.active), "start": start}


def _demo_entry(tables: Mapping[str, object]) -> dict[str, object]:
    config = config_from_tables(tables)
    join_process_group(config)
    try:
        return run_rank(config).to_dict()
    finally:
        dist.destroy_process_group()


def run_demo(config: TrainConfig, *, baseline: bool = True) -> dict[str, object]:
    """Launch the demo's processes and return rank 0's results (``{"elastic": ..., "baseline": ...}``).

    Each run gets processes of its own, so that neither inherits what the other left behind (process groups,
    the activation cache, allocator state).

    Args:
        config: the elastic run (see :func:`demo_config`).
        baseline: then train the no-freezing reference (:data:`REFERENCE`) too.
    """
    out: dict[str, object] = {"elastic": launch(config, _demo_entry, config.to_dict())[0]}
    if baseline:
        sys.stderr.write("--- the reference: the same run without freezing ---\n")
        reference = config.override(REFERENCE)
        out["baseline"] = launch(reference, _demo_entry, reference.to_dict())[0]
    return out
