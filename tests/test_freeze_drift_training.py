"""The probe-driven policy inside the elastic trainer: the probe's output drift is measured through the pipeline at
every decision point, merged over stages, re-based after each transition, and the same whatever the layout."""

from __future__ import annotations

import math
from typing import Any

import pytest

from elastic_pipe.testing import RankContext, run_distributed, run_tasks
from recording_drift import RecordingDrift


def _train(  # noqa: PLR0917 - run_tasks hands the arguments over as a tuple
    ctx: RankContext, pipe_len: int, threshold: float, cache: str = "off", epochs: int = 2, graphs: str = "auto"
) -> dict[str, Any]:
    import torch

    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split
    from elastic_pipe.orchestrator.stage import probe

    torch.manual_seed(0)
    d = load_digits()
    tables: dict[str, Any] = {
        "model": {"name": "vit"},
        "train": {"epochs": epochs, "global_batch": 16, "lr": 0.01, "seed": 0, "cuda_graphs": graphs},
        "freeze": {"decide_every": 2},
        "pipeline": {"microbatches": 2, "pipe_len": pipe_len, "cache": cache},
        "launch": {"nproc_per_node": ctx.world_size},  # one rank on a GPU machine: that GPU (NCCL)
        "log": {"progress": False},
    }
    # no dropout: the masks are drawn per rank, so two layouts would train differently
    model = models.vit(config="vit-tiny", depth=4, dim=16, heads=2, mlp_dim=32, dropout=0.0)
    policy = RecordingDrift(4, threshold=threshold, patience=1, tolerance=None)
    samples = Split(d.inputs[:64], d.labels[:64], d.sample_ids[:64])
    released: list[int] = []  # per probe on this rank: the leading sub-layers whose weights were released
    captures: list[int] = []  # per probe on this rank: the segments its stage's ForwardGraphs had captured
    unit_outputs = probe._unit_outputs

    def recording(run: Any, stage: Any, prefix: Any, watched: int) -> Any:
        # the released sub-layers must not run: NaN weights while the probe runs would make its drift NaN
        released.append(prefix.released)
        held = [p for m in run.sublayers[: prefix.released] for p in m.parameters() if p.device.type != "meta"]
        saved = [p.detach().clone() for p in held]
        with torch.no_grad():
            for p in held:
                p.fill_(float("nan"))
        try:
            return unit_outputs(run, stage, prefix, watched)
        finally:
            captures.append(stage.probe_graphs.captures)
            with torch.no_grad():
                for p, v in zip(held, saved, strict=True):
                    p.copy_(v)

    probe._unit_outputs = recording  # type: ignore[assignment]
    try:
        with ElasticTrainer(config_from_tables(tables), model=model, data=samples, policy=policy, quiet=True) as t:
            result = t.fit()
    finally:
        probe._unit_outputs = unit_outputs  # type: ignore[assignment]
    return {
        "released": released,
        "captures": captures,
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


@pytest.mark.distributed
@pytest.mark.slow
def test_the_probe_reads_the_kept_prefix_outputs_once_the_prefix_is_released() -> None:
    """With the activation cache on, the stage-0 ranks release the frozen prefix's weights once the cache serves
    it (on a GPU rank 0 keeps them in host memory, where a forward pass cannot run them); the probe then starts
    from the prefix outputs kept for the evaluation, and reads exactly the drift the run without a cache reads."""
    # 1 stage x 2 replicas, 4 epochs of 3 steps, a decision point every 2 steps; a tiny threshold freezes one unit
    # at the first decision points, then the cache fills and the prefix is released before later ones
    runs = run_distributed(
        run_tasks,
        2,
        {"cached": (_train, (1, 10.0, "on", 4)), "plain": (_train, (1, 10.0, "off", 4))},
        timeout=500,
    )
    cached, plain = runs[0]["cached"], runs[0]["plain"]
    assert cached["frozen"] == plain["frozen"] and cached["frozen"]
    assert any(r > 0 for r in cached["released"]), cached["released"]  # some probe ran with the prefix released
    assert not any(plain["released"])
    assert len(cached["seen"]) == len(plain["seen"])
    for a, b in zip(cached["seen"], plain["seen"], strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12)
    assert cached["losses"] == pytest.approx(plain["losses"], rel=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_the_probe_runs_on_a_gpu_with_the_prefix_released_replayed_as_graphs_or_eagerly() -> None:
    """On a GPU rank 0 keeps the released prefix in host memory: a probe that ran it would fail. The probe's
    segments are captured and replayed as CUDA graphs (``[train] cuda_graphs`` not "off"), and read the drift the
    eager probe reads."""
    tasks = {"graphs": (_train, (1, 10.0, "on", 4, "auto")), "eager": (_train, (1, 10.0, "on", 4, "off"))}
    out = run_distributed(run_tasks, 1, tasks, timeout=500)[0]
    graphs, eager = out["graphs"], out["eager"]
    assert graphs["frozen"] and any(r > 0 for r in graphs["released"]), graphs["released"]
    assert all(math.isfinite(c) for change in graphs["seen"] for c in change)
    assert max(graphs["captures"]) > 0 and max(eager["captures"]) == 0, (graphs["captures"], eager["captures"])
    assert graphs["frozen"] == eager["frozen"]
    for a, b in zip(graphs["seen"], eager["seen"], strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-9)
