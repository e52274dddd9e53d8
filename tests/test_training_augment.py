"""Random transforms and the activation cache, end to end in training on 2 gloo processes.

A dataset whose transform adds seeded noise declares ``random_augmentation = True``. With the cache on, the default
``cache_policy = "bypass"`` recomputes the frozen prefix from each step's noisy input (the same losses as the cache
off, to the last bit); ``"views"`` fills ``views`` noisy draws per sample at each transition, every epoch reads
only cached entries (no miss), epoch ``e`` reads view ``e % views``, and the losses then differ from recomputing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

#: 300 digits: 240 training samples, 7 steps of 32 per epoch (drop_last) and 16 dropped.
SAMPLES = 300
#: Noise the transform adds (large enough that a replayed draw changes the losses).
NOISE = 0.3


def _noisy() -> Any:
    from plug_data import Digits

    class Noisy(Digits):
        """Digits plus fresh Gaussian noise at every read, drawn from torch's generator (the trainer reseeds it at
        every step, so the draws are seeded)."""

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            x, y = super().__getitem__(index)
            return x + NOISE * torch.randn(x.shape, dtype=x.dtype), y

    noisy = Noisy(SAMPLES)
    noisy.random_augmentation = True  # the declaration the trainer reads
    return noisy


def _config(**pipeline: Any) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "train": {"dtype": "float64", "epochs": 4, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            # the boundary moves before epochs 1 and 2 (the second move also halves the pipeline: 2 replicas)
            "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
            "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", **pipeline},
            "launch": {"nproc_per_node": 2},
            "log": {"progress": False},
        }
    )


def _runs(ctx: RankContext) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer

    out: dict[str, Any] = {}
    for name, pipeline in (
        ("off", {"cache": "off"}),
        ("bypass", {"cache": "on"}),  # the default policy for a dataset with random transforms
        ("views", {"cache": "on", "cache_policy": "views", "views": 2}),
    ):
        with ElasticTrainer(_config(**pipeline), data=_noisy(), quiet=True) as trainer:
            out[name] = trainer.fit().to_dict()
            cache = trainer.prefix.cache
            out[name + "_views"] = None if cache is None else cache.config.views_per_sample
    return out


@pytest.mark.distributed
@pytest.mark.slow
def test_bypass_recomputes_and_views_read_only_cached_views() -> None:
    results = run_distributed(_runs, 2, timeout=400)
    off, bypass, views = (results[0][k] for k in ("off", "bypass", "views"))
    layouts = [(e["frozen_sublayers"] > 0, e["pipe_len"], e["replicas"]) for e in off["epochs"]]
    assert layouts == [(False, 2, 1), (True, 2, 1), (True, 1, 2), (True, 1, 2)]
    # bypass: never read, nothing looked up, the same losses as without a cache (the noise is seeded per step)
    assert [e["cache"] for e in bypass["epochs"]] == [False] * 4
    assert [(e["cache_hits"], e["cache_misses"]) for e in bypass["epochs"]] == [(0, 0)] * 4
    assert bypass["losses"] == off["losses"]
    assert results[0]["bypass_views"] == 1
    # views: every frozen epoch reads only cached views (224 samples a step of the 7 steps, no miss) ...
    assert results[0]["views_views"] == 2
    assert [e["cache"] for e in views["epochs"]] == [False, True, True, True]
    assert [(e["cache_hits"], e["cache_misses"]) for e in views["epochs"]] == [(0, 0)] + [(224, 0)] * 3
    # ... epoch e picks view e % 2 ...
    assert [e["cache_view"] for e in views["epochs"]] == [-1, 1, 0, 1]
    # ... which were drawn at the fill, not at the step: the first epoch (no prefix) agrees, the cached ones do not
    assert views["losses"][:7] == off["losses"][:7]
    assert views["losses"][7:] != pytest.approx(off["losses"][7:], rel=1e-6)
    assert all(torch.isfinite(torch.tensor(views["losses"])))
    assert results[1]["views"]["losses"] == views["losses"]
