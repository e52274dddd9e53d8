"""The steps fill the cache (``cache = "auto"``, one rank): a boundary whose cache is not read (reading did not pay)
still stores what its steps compute, so the next boundary is carried from those entries through the newly frozen
sub-layers alone and its fill runs nothing from the inputs; and a first boundary that is read is filled by its
steps' misses, not by a pass over the split first. The losses are those of the runs that fill at the
transition. A step whose batch is partly cached runs the prefix on the whole batch (one forward size per step).
The payoff of reading is measured at the first boundary and not again at the second when it paid there
(``prefix.fill.ReadsPaid``; measured again when it did not)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import tiny_vit
from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.testing import RankContext, run_distributed

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

#: 300 digits: 240 training samples, 7 steps of 32 and a short one of 16 per epoch.
SAMPLES = 300
TRAIN = 240

pytestmark = pytest.mark.distributed


def _config(cache: str = "auto", world: int = 1) -> Any:
    return config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "train": {"dtype": "float64", "epochs": 4, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
            "pipeline": {"microbatches": 1, "pipe_len": 1, "cache": cache},
            "log": {"progress": False},
            "data": {"drop_last": False},
            "launch": {"nproc_per_node": world},
        }
    )


def _count_runs() -> list[tuple[int, int, int]]:
    """Every sub-layer range this process runs from here on, ``(lo, hi, rows)`` in order (``run_sublayers``
    wrapped; the callers put it back)."""
    from elastic_pipe.orchestrator.context import RunContext

    runs: list[tuple[int, int, int]] = []
    run_sublayers = RunContext.run_sublayers

    def counted(self: RunContext, x: Any, lo: int, hi: int) -> Any:
        runs.append((lo, hi, int(x.shape[0])))
        return run_sublayers(self, x, lo, hi)

    RunContext.run_sublayers = counted  # type: ignore[method-assign]
    return runs


def _runs(ctx: RankContext, read_first: bool, world: int = 1) -> dict[str, Any]:
    from plug_data import Digits

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.prefix import fill as prefix_cache
    from elastic_pipe.orchestrator.prefix import frozen as prefix_frozen

    # reading pays from the first boundary on (read_first), or only from the second (the measured decision is
    # replaced: the machine's speed must not matter)
    boundaries: list[int] = []

    def decide(job: Any, *, mode: str, **_: Any) -> tuple[bool, str]:
        frozen = job.frozen
        boundaries.append(frozen)
        return mode == "on" or read_first or frozen > boundaries[0], f"test: frozen {frozen}"

    prefix_cache._decide = decide
    prefix_runs = _count_runs()
    fills = prefix_frozen.in_steps
    out: dict[str, Any] = {}
    for name, in_steps in (("in_steps", True), ("at_transition", False)):
        prefix_frozen.in_steps = fills if in_steps else (lambda cache, frozen, example, samples: False)
        prefix_runs.clear()
        boundaries.clear()
        with ElasticTrainer(_config(world=world), data=Digits(SAMPLES), quiet=True) as trainer:
            result = trainer.fit().to_dict()
            out[name] = {
                "losses": result["losses"],
                "epochs": [
                    (e["frozen_units"], e["cache"], e["cache_hits"], e["cache_misses"]) for e in result["epochs"]
                ],
                "runs": list(prefix_runs),
                "stored": trainer.prefix.cache.stats.stored if trainer.prefix.cache is not None else -1,
                "boundaries": list(boundaries),
            }
    prefix_frozen.in_steps = fills
    return out


def _each_read_first(ctx: RankContext) -> dict[bool, dict[str, Any]]:
    """``_runs`` with ``read_first`` false, then true, in one 1-rank job (starting the rank costs more than the
    runs); what ``_runs`` patches is put back after each, so the second starts from the real functions as it would
    in a job of its own."""
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.prefix import fill as prefix_cache
    from elastic_pipe.orchestrator.prefix import frozen as prefix_frozen

    out = {}
    for read_first in (False, True):
        originals = (prefix_cache._decide, RunContext.run_sublayers, prefix_frozen.in_steps)
        try:
            out[read_first] = _runs(ctx, read_first)
        finally:
            prefix_cache._decide, RunContext.run_sublayers, prefix_frozen.in_steps = originals  # type: ignore[method-assign]
    return out


@pytest.fixture(scope="module")
def one_rank() -> dict[bool, dict[str, Any]]:
    return run_distributed(_each_read_first, 1, timeout=500)[0]  # type: ignore[no-any-return]


def _rows(runs: list[tuple[int, int, int]], lo: int, hi: int) -> int:
    return sum(rows for a, b, rows in runs if (a, b) == (lo, hi))


def test_steps_fill_an_unread_boundary_and_the_next_one_is_carried_from_it(one_rank: dict[bool, Any]) -> None:
    r = one_rank[False]
    in_steps, at_transition = r["in_steps"], r["at_transition"]
    expected = [(0, False, 0, 0), (1, False, 0, 0), (2, True, TRAIN, 0), (2, True, TRAIN, 0)]
    assert in_steps["epochs"] == at_transition["epochs"] == expected
    assert in_steps["losses"] == pytest.approx(at_transition["losses"], rel=1e-10, abs=1e-12)
    first, second = in_steps["boundaries"]  # sub-layer boundaries of epochs 1 and 2
    assert at_transition["boundaries"] == [first, second] and 0 < first < second
    # epoch 1's steps ran the first boundary's prefix on each training sample once and stored every output
    assert _rows(in_steps["runs"], 0, first) == _rows(at_transition["runs"], 0, first) == TRAIN
    assert in_steps["stored"] == TRAIN
    # into epoch 2: the carry ran the newly frozen sub-layers alone on the stored entries; the whole prefix ran on
    # the held-out samples only (the evaluation's outputs)
    held_out = SAMPLES - TRAIN
    assert _rows(in_steps["runs"], first, second) == TRAIN
    assert _rows(in_steps["runs"], 0, second) == held_out
    # without it, the transition's fill ran the whole prefix over the training split as well
    assert _rows(at_transition["runs"], 0, second) == TRAIN + held_out
    assert _rows(at_transition["runs"], first, second) == 0


def test_a_first_boundary_that_is_read_is_filled_by_the_steps_misses(one_rank: dict[bool, Any]) -> None:
    r = one_rank[True]
    in_steps, at_transition = r["in_steps"], r["at_transition"]
    # epoch 1 reads the cache in both; filled by its steps, every read misses (and is stored), then all hit
    assert in_steps["epochs"] == [(0, False, 0, 0), (1, True, 0, TRAIN), (2, True, TRAIN, 0), (2, True, TRAIN, 0)]
    assert at_transition["epochs"] == [(0, False, 0, 0), (1, True, TRAIN, 0), (2, True, TRAIN, 0), (2, True, TRAIN, 0)]
    assert in_steps["losses"] == pytest.approx(at_transition["losses"], rel=1e-10, abs=1e-12)
    first, second = in_steps["boundaries"]
    held_out = SAMPLES - TRAIN
    # the first boundary's prefix ran once per training sample either way: by the steps, or by the fill before
    # epoch 1 (whose complete cache released the prefix, so the held-out samples' outputs were taken there too)
    assert _rows(in_steps["runs"], 0, first) == TRAIN
    assert _rows(at_transition["runs"], 0, first) == TRAIN + held_out
    assert in_steps["stored"] == at_transition["stored"] == TRAIN
    # into epoch 2 both carry the training entries; the run that had released the prefix carries the held-out
    # outputs too, the other takes them once its cache is complete
    assert _rows(in_steps["runs"], first, second) == TRAIN
    assert _rows(at_transition["runs"], first, second) == TRAIN + held_out


def test_two_replicas_fill_an_unread_boundary_by_their_steps_and_the_shared_fill_carries_them() -> None:
    for r in run_distributed(_runs, 2, False, 2, timeout=300):
        in_steps, at_transition = r["in_steps"], r["at_transition"]
        assert (
            in_steps["epochs"]
            == at_transition["epochs"]
            == [(0, False, 0, 0), (1, False, 0, 0), (2, True, TRAIN, 0), (2, True, TRAIN, 0)]
        )
        assert in_steps["losses"] == pytest.approx(at_transition["losses"], rel=1e-10, abs=1e-12)
        first, second = in_steps["boundaries"]
        # each replica's steps ran its half of the split through the first boundary's prefix
        assert _rows(in_steps["runs"], 0, first) == _rows(at_transition["runs"], 0, first) == TRAIN // 2
        # the shared fill carries the entries a peer stored among its own chunks and runs the whole prefix on less
        assert _rows(in_steps["runs"], first, second) > 0 == _rows(at_transition["runs"], first, second)
        assert _rows(in_steps["runs"], 0, second) < _rows(at_transition["runs"], 0, second)


def _mixed_batches(ctx: RankContext) -> dict[str, Any]:
    """A first boundary entered after step 3 of epoch 0, read and filled by the steps' misses: the rest of epoch 0
    fills its batches, and epoch 1's shuffled batches mix samples cached then with samples not yet cached."""
    from plug_data import Digits

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.prefix import fill as prefix_cache

    prefix_cache._decide = lambda job, *, mode, **_: (True, "test: reading pays")
    runs = _count_runs()
    tables = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 2, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
        "freeze": {"policy": "plug_policy:OneUnitFromStep3", "decide_every": 1},
        "pipeline": {"microbatches": 1, "pipe_len": 1, "cache": "auto"},
        "log": {"progress": False},
        "data": {"drop_last": False},
    }
    with ElasticTrainer(config_from_tables(tables), data=Digits(SAMPLES), quiet=True) as trainer:
        result = trainer.fit().to_dict()
    epochs = [(e["frozen_units"], e["cache_hits"], e["cache_misses"]) for e in result["epochs"]]
    return {"runs": runs, "epochs": epochs}


def test_a_step_with_part_of_its_batch_cached_runs_the_prefix_on_the_whole_batch() -> None:
    r = run_distributed(_mixed_batches, 1, timeout=300)[0]
    prefix = [rows for lo, hi, rows in r["runs"] if lo == 0 and hi > 0]
    held_out = SAMPLES - TRAIN
    # 240 training samples: 7 batches of 32 and one of 16 an epoch; the evaluation runs the held-out 60
    assert prefix and set(prefix) <= {32, 16, held_out}, sorted(set(prefix))
    (_, hits0, misses0), (_, hits1, misses1) = r["epochs"]
    assert hits0 == 0 and 0 < misses0 < TRAIN  # the steps after the freeze, all of them misses
    assert hits1 > 0 and misses1 > 0 and hits1 + misses1 == TRAIN  # epoch 1: mixed batches
    # every batch with a miss ran whole: more rows went through the prefix than were missing
    trained = sum(rows for rows in prefix if rows != held_out)
    assert trained > misses0 + misses1


def _forced(measure: Any, pays: bool, measured: list[int]) -> Any:
    """``measure`` (the cache's payoff measure) answering ``pays`` whatever it timed, each boundary logged."""
    import dataclasses

    def forced(cache: Any, inputs: Any, boundary: int, *args: Any, **kwargs: Any) -> Any:
        measured.append(boundary)
        return dataclasses.replace(measure(cache, inputs, boundary, *args, **kwargs), enabled=pays)

    return forced


def _payoff_measures(ctx: RankContext) -> dict[bool, Any]:
    """The run of ``_config("auto")`` with the payoff measure's answer forced to ``pays`` (the machine's speed must
    not matter), once each way: the boundaries measured and whether each epoch read the cache."""
    from plug_data import Digits

    from elastic_pipe import cache as acache
    from elastic_pipe.orchestrator import ElasticTrainer

    measure = acache.measure_tiered_payoff
    out: dict[bool, Any] = {}
    for pays in (True, False):
        measured: list[int] = []
        acache.measure_tiered_payoff = _forced(measure, pays, measured)
        try:
            with ElasticTrainer(_config(), data=Digits(SAMPLES), quiet=True) as trainer:
                result = trainer.fit().to_dict()
        finally:
            acache.measure_tiered_payoff = measure
        out[pays] = {"measured": measured, "read": [(e["frozen_units"], e["cache"]) for e in result["epochs"]]}
    return out


def test_reading_that_paid_at_the_first_boundary_is_not_measured_again_at_the_second() -> None:
    r = run_distributed(_payoff_measures, 1, timeout=300)[0]
    # it paid at the first boundary: the second (same entries, a longer prefix) reads without a measure
    assert r[True]["read"] == [(0, False), (1, True), (2, True), (2, True)]
    assert len(r[True]["measured"]) == 1
    # it did not: each boundary is measured (a longer prefix may pay), and nothing is read
    assert r[False]["read"] == [(0, False), (1, False), (2, False), (2, False)]
    first, second = r[False]["measured"]
    assert r[True]["measured"] == [first] and 0 < first < second
