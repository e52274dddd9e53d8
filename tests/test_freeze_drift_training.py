"""The probe-driven policy inside the elastic trainer: the probe's output drift is measured through the pipeline at
every decision point, merged over stages, re-based after each transition, and the same whatever the layout."""

from __future__ import annotations

import math
from typing import Any

import pytest

from elastic_pipe.testing import RankContext, run_distributed, run_tasks
from recording_drift import RecordingDrift


def _train(ctx: RankContext, pipe_len: int, threshold: float) -> dict[str, Any]:
    import torch

    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.workload import Split

    torch.manual_seed(0)
    d = load_digits()
    tables: dict[str, Any] = {
        "model": {"name": "vit"},
        "train": {"epochs": 2, "global_batch": 16, "lr": 0.01, "seed": 0},
        "freeze": {"decide_every": 2},
        "pipeline": {"microbatches": 2, "pipe_len": pipe_len, "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }
    # no dropout: the masks are drawn per rank, so two layouts would train differently
    model = models.vit(config="vit-tiny", depth=4, dim=16, heads=2, mlp_dim=32, dropout=0.0)
    policy = RecordingDrift(4, threshold=threshold, patience=1, tolerance=None)
    samples = Split(d.inputs[:64], d.labels[:64], d.sample_ids[:64])
    with ElasticTrainer(config_from_tables(tables), model=model, data=samples, policy=policy, quiet=True) as t:
        result = t.fit()
    return {
        "seen": policy.seen,
        "frozen": [e["frozen_units"] for e in result.transitions],
        "pipe_lens": [e["pipe_len"] for e in result.transitions],
        "losses": result.losses,
    }


@pytest.mark.distributed
@pytest.mark.slow
def test_probe_drift_is_the_same_through_a_pipeline_and_across_transitions() -> None:
    # every change is below this threshold: one more unit frozen at every decision point
    # the piped run (2 stages), then the replicated one (1 stage x 2), in one job: starting the ranks costs more
    # than a run; each seeds and builds its own model, policy and trainer
    runs = run_distributed(run_tasks, 2, {"piped": (_train, (2, 10.0)), "replicated": (_train, (1, 10.0))}, timeout=500)
    piped, replicated = runs[0]["piped"], runs[0]["replicated"]
    assert len(piped["losses"]) == 6  # 2 epochs of 3 steps (the training part of 64 samples, batch 16)
    assert piped["frozen"] == replicated["frozen"] == [1, 2]  # after steps 2 and 4 (6 is the run's last)
    assert piped["pipe_lens"][0] == 2  # the first transition moves the stage boundary: units change owners
    assert len(piped["seen"]) == 2
    for t, change in enumerate(piped["seen"]):
        frozen = min(t, 3)
        assert all(c == 0.0 for c in change[:frozen])  # frozen units are not probed
        assert all(math.isfinite(c) and c > 0.0 for c in change[frozen:3])  # re-based after every transition
        assert change[3] == 0.0  # past the cap: never probed
    for a, b in zip(piped["seen"], replicated["seen"], strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-9)
    assert piped["losses"] == pytest.approx(replicated["losses"], rel=1e-5)
