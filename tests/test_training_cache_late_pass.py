"""A first fill by a pass over the split is skipped where the rest of the run would read no more entries than the
pass fills (``cache = "auto"``, :func:`elastic_pipe.orchestrator.prefix.fill.pass_idle`): with two views per
sample, a boundary entered with three epochs left is filled (both views), one entered with one epoch left is not
(the steps run the prefix; nothing is measured, filled or stored). One rank, randomly flipped digits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import tiny_vit
from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.orchestrator.prefix.fill import pass_idle
from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

#: 300 digits: 240 training samples, 8 steps of 32 (a short last one) per epoch; 60 held out.
SAMPLES = 300
TRAIN = 240
VIEWS = 2


def _config(freeze_at: int) -> Any:
    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "train": {"dtype": "float64", "epochs": 4, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {freeze_at: 1}}},
            "pipeline": {"pipe_len": 1, "cache": "auto", "cache_policy": "views", "views": VIEWS},
            "data": {"drop_last": False},
            "log": {"progress": False},
        }
    )


def _runs(ctx: RankContext) -> dict[int, dict[str, Any]]:
    from plug_data import Digits

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.prefix import fill

    decided: list[int] = []

    def decide(job: Any, **_: Any) -> tuple[bool, str]:  # reading pays: the machine's speed must not matter
        decided.append(job.frozen)
        return True, "test: reading pays"

    fill._decide = decide
    out = {}
    for freeze_at in (1, 3):
        decided.clear()
        with ElasticTrainer(_config(freeze_at), data=Digits(SAMPLES, flip=True), quiet=True) as trainer:
            result = trainer.fit().to_dict()
            cache = trainer.prefix.cache
            assert cache is not None
            out[freeze_at] = {
                "cache": [e["cache"] for e in result["epochs"]],
                "reason": trainer.prefix.report.reason,
                "decided": list(decided),
                "stored": cache.stats.stored,
                "views": cache.config.views_per_sample,
            }
    return out


@pytest.fixture(scope="module")
def runs() -> dict[int, dict[str, Any]]:
    return run_distributed(_runs, 1, timeout=300)[0]  # type: ignore[no-any-return]


@pytest.mark.distributed
def test_a_boundary_with_more_epochs_left_than_views_is_filled(runs: dict[int, dict[str, Any]]) -> None:
    early = runs[1]
    assert early["views"] == VIEWS
    assert early["cache"] == [False, True, True, True]
    assert len(early["decided"]) == 1 and early["stored"] == VIEWS * TRAIN


@pytest.mark.distributed
def test_a_boundary_with_fewer_epochs_left_than_views_runs_the_prefix_in_the_steps(
    runs: dict[int, dict[str, Any]],
) -> None:
    late = runs[3]
    assert late["cache"] == [False, False, False, False]
    assert late["reason"].startswith("off: 1.00 epochs left")
    assert late["decided"] == [] and late["stored"] == 0


@pytest.mark.parametrize(
    ("left", "views", "idle"), [(None, 2, False), (2.01, 2, False), (2.0, 2, True), (0.5, 1, True), (1.5, 1, False)]
)
def test_a_pass_is_idle_when_the_epochs_left_read_no_more_than_it_fills(
    left: float | None, views: int, idle: bool
) -> None:
    reason = pass_idle(left, views)
    assert bool(reason) is idle
    assert not idle or reason.startswith(f"off: {left:.2f} epochs left")
