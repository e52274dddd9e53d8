"""The frozen prefix is released on stage-0 ranks while the activation cache serves it completely.

A pure test checks the transfer plan (a released prefix travels to no one). The gloo tests train the float64 ViT
of the equivalence test on 2 ranks (2 stages, then 1 stage x 2 replicas, the cache on): once with the prefix
released and once with it kept resident (release patched off in the workers), and compare what each rank holds,
the evaluations, the losses and the final model; then bring the prefix back and check it arrives bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest

import tiny_vit
from elastic_pipe.groups import plan_spmd
from elastic_pipe.orchestrator import OrchestratorError
from elastic_pipe.orchestrator.transition import Transfer, plan_transfers
from elastic_pipe.testing import RankContext, run_distributed, run_tasks
from elastic_pipe.types import Layout


# ------------------------------------------------------------------------------------------------ transfer plans
def test_a_released_prefix_travels_to_no_one() -> None:
    # 2 stages x 2 replicas with 0:3 frozen and released -> 1 stage x 4 replicas with 0:5 frozen: ranks 1 and 3
    # become stage 0 and get only the newly frozen 3:5 (the carry runs those), never the released 0:3
    old, new = Layout(3, 2, 2, (3, 5, 8), 4), Layout(5, 1, 4, (5, 8), 1)
    old_plan, new_plan = plan_spmd(4, 2), plan_spmd(4, 1)
    assert plan_transfers(old, new, old_plan, new_plan, released=3) == (
        Transfer(0, 1, (3, 4), optimizer_state=False),
        Transfer(1, 0, (5, 6, 7), optimizer_state=True),
        Transfer(2, 3, (3, 4), optimizer_state=False),
        Transfer(3, 2, (5, 6, 7), optimizer_state=True),
    )
    # resident, the same transition sends the whole new prefix
    resident = plan_transfers(old, new, old_plan, new_plan)
    assert Transfer(0, 1, (0, 1, 2, 3, 4), optimizer_state=False) in resident
    with pytest.raises(OrchestratorError, match=r"released must lie in \[0, 3\].*got 4"):
        plan_transfers(old, new, old_plan, new_plan, released=4)


# ------------------------------------------------------------------------------------------------ when it may go
def _ctx(model: Any, n: int) -> Any:
    from types import SimpleNamespace

    import torch

    return SimpleNamespace(train_set=SimpleNamespace(sample_ids=torch.arange(n)), model=model)


def _model(tied: bool = False) -> Any:
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    if tied:
        model[2].weight = model[0].weight
    return model


def test_the_prefix_may_go_only_when_every_sample_is_cached_in_memory(tmp_path: Any) -> None:
    import torch

    from elastic_pipe import cache as acache
    from elastic_pipe.orchestrator.prefix.residency import eligible

    ids, rows = torch.arange(10), torch.ones(10, 3)
    cache = acache.ActivationCache(10, device_budget=1 << 20)
    cache.put(ids[:9], 2, rows[:9])
    assert not eligible(_ctx(_model(), 10), cache, 2)  # one sample missing: the prefix stays
    cache.put(ids[9:], 2, rows[9:])
    assert eligible(_ctx(_model(), 10), cache, 2)
    assert not eligible(_ctx(_model(), 10), cache, 0)  # nothing frozen
    assert not eligible(_ctx(_model(), 10), cache, 1)  # no entries at that boundary
    assert not eligible(_ctx(_model(tied=True), 10), cache, 2)  # a prefix weight tied to a later sub-layer
    # entries on the disk tier: a read that fails its crc32 would need the prefix
    disk = acache.ActivationCache(10, disk_budget=1 << 20, disk_dir=str(tmp_path))
    disk.put(ids, 2, rows)
    assert disk.cached(ids, 2).all() and not eligible(_ctx(_model(), 10), disk, 2)
    disk.unlink()
    # a cache that bypasses itself (random transforms, cache_policy = "bypass") never serves the prefix
    bypass = acache.ActivationCache(10, device_budget=1 << 20, augmentation="random", on_random_augmentation="bypass")
    bypass.put(ids, 2, rows)
    assert not eligible(_ctx(_model(), 10), bypass, 2)
    # every view must be cached
    views = acache.ActivationCache(
        10, device_budget=1 << 20, augmentation="random", on_random_augmentation="views", views=2
    )
    views.put(ids, 2, rows)
    assert not eligible(_ctx(_model(), 10), views, 2)
    views.set_epoch(1)
    views.put(ids, 2, rows)
    assert eligible(_ctx(_model(), 10), views, 2)


# ------------------------------------------------------------------------------------------ training on 2 ranks
#: A 320-sample slice of the digits: 256 training samples, 64 held out.
SAMPLES = 320


def _config(overrides: dict[str, Any] | None = None) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": tiny_vit.model_table(),
        "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
        "pipeline": {"microbatches": 2, "pipe_len": 2, "solver": "optimal", "compression": "halving", "cache": "on"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }
    return config_from_tables(tables).override(overrides or {})


def _samples() -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])


def _train(release: bool, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.evaluation import evaluate
    from elastic_pipe.orchestrator.prefix import residency as prefix_residency
    from elastic_pipe.orchestrator.transition.holdings import held_bytes

    snaps: list[dict[str, Any]] = []

    def after_epoch(trainer: Any) -> None:
        ctx, layout = trainer.ctx, trainer.state.layout
        prefix = ctx.sublayers[: layout.frozen]
        snaps.append(
            {
                "layout": [layout.frozen, layout.pipe_len, layout.replicas],
                "released": trainer.prefix.released,
                "parameters": held_bytes(ctx)["parameters"],
                "prefix_bytes": sum(ctx.param_bytes[: layout.frozen]),
                "prefix_meta": [all(p.is_meta for p in m.parameters()) for m in prefix],
                "eval_bytes": trainer.prefix.eval_bytes,
            }
        )

    original = prefix_residency.eligible
    if not release:
        prefix_residency.eligible = lambda *args: False  # type: ignore[assignment]
    try:
        with ElasticTrainer(_config(overrides), data=_samples(), quiet=True) as trainer:
            result = trainer.fit(on_epoch_end=after_epoch)
            # plain lists: tensors do not cross the harness's queue
            full = {k: v.flatten().tolist() for k, v in trainer.full_state_dict().items()}
            out: dict[str, Any] = {"result": result.to_dict(), "snaps": snaps, "full": full}
            ctx, layout = trainer.ctx, trainer.state.layout
            if release:  # bring the prefix back (as a boundary the cache no longer covers would): bit for bit
                released = trainer.prefix.released
                prefix_residency.restore(ctx, layout, released)
                trainer.prefix.forget()
                state = ctx.model.state_dict()
                out["restored"] = {
                    k: state[k].flatten().tolist() for j in range(released) for k in ctx.sublayer_keys[j]
                }
                out["resident_eval"] = evaluate(ctx, layout, trainer.prefix)
    finally:
        prefix_residency.eligible = original
    return out


def _both(ctx: RankContext) -> dict[str, Any]:
    return {"released": _train(True), "resident": _train(False)}


def _small_cache(ctx: RankContext) -> dict[str, Any]:
    # room for 100 of the 256 training samples' entries (17 tokens x 16 dims, float64)
    return _train(True, {"pipeline.cache_tiers": {"device": 100 * 17 * 16 * 8}})


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    """The three trainings of the tests below, one after the other in one 2-rank job (each test started its own:
    the ranks' start-up cost about as much as a training); each builds its own trainer, and ``_train`` puts back
    what it patches. Timeout: the suite's 500 s cap (400 s + 300 s before; the trainings take seconds)."""
    return run_distributed(run_tasks, 2, {"both": (_both, ()), "small_cache": (_small_cache, ())}, timeout=500)


@pytest.mark.distributed
@pytest.mark.slow  # ~2 minutes on 2 shared cores
def test_the_prefix_is_released_while_the_cache_serves_it_and_nothing_else_changes(
    two_ranks: list[dict[str, Any]],
) -> None:
    results = [r["both"] for r in two_ranks]
    for rank, r in enumerate(results):
        rel, res = r["released"], r["resident"]
        assert [s["layout"] for s in rel["snaps"]] == [[3, 2, 1], [5, 1, 2], [5, 1, 2]]
        # released once the cache serves the prefix; resident (as before) in the patched run
        assert [s["released"] for s in rel["snaps"]] == [3, 5, 5]
        assert [s["released"] for s in res["snaps"]] == [0, 0, 0]
        for a, b in zip(rel["snaps"], res["snaps"], strict=True):
            if rank == 0:  # rank 0 keeps the one copy (on a CPU device, where it was)
                assert a["parameters"] == b["parameters"] and not any(a["prefix_meta"]), a
            elif a["layout"][1] == 1:  # rank 1 is stage 0 of replica 1: its parameter bytes drop by the prefix's
                assert all(a["prefix_meta"]), a
                assert a["parameters"] == b["parameters"] - a["prefix_bytes"] > 0, (a, b)
                assert a["eval_bytes"] == 64 * 17 * 16 * 8  # 64 held-out samples, 17 tokens x 16 dims, float64
            else:  # stage 1: it never held the prefix
                assert a["parameters"] == b["parameters"]
        # training agrees to rounding (carried or broadcast cache entries, not recomputed: the last bit may move,
        # as in the weights below); every evaluation equals the resident prefix's
        assert rel["result"]["losses"] == pytest.approx(res["result"]["losses"], rel=1e-12, abs=1e-12)
        evals = [(e["eval_loss"], e["eval_accuracy"]) for e in rel["result"]["epochs"]]
        for (loss, acc), e in zip(evals, res["result"]["epochs"], strict=True):
            assert loss == pytest.approx(e["eval_loss"], rel=1e-9, abs=1e-12) and acc == e["eval_accuracy"]
        # the prefix back on every stage-0 rank evaluates the same
        assert rel["resident_eval"][0] == pytest.approx(evals[-1][0], rel=1e-9)
    # the events report the bytes freed: rank 1's prefix at the move to 1 x 2 (rank 0 keeps it on the CPU here)
    rel0, res0 = results[0]["released"], results[0]["resident"]
    events = rel0["result"]["transitions"]
    assert [t["prefix_released_bytes"] for t in events] == [0, results[1]["released"]["snaps"][1]["prefix_bytes"]]
    assert all(t["prefix_released_bytes"] == 0 for t in res0["result"]["transitions"])
    # the final model still holds the frozen prefix, bit for bit the resident run's; the rest agrees to rounding
    # (a replica's cache entries came carried, or broadcast from rank 0, instead of recomputed from the inputs)
    full, ref = rel0["full"], res0["full"]
    assert list(full) == list(ref)
    prefix_keys = [k for k in ref if k.startswith(("embed.", "block0_", "block1_"))]
    assert len(prefix_keys) >= 5 and all(full[k] == ref[k] for k in prefix_keys)
    differ = max(abs(a - b) for k in ref for a, b in zip(full[k], ref[k], strict=True))
    assert differ < 1e-12
    assert results[1]["released"]["full"] == {}
    # the prefix brought back from rank 0 is rank 0's, bit for bit
    back = results[1]["released"]["restored"]
    assert back and all(back[k] == full[k] for k in back)


@pytest.mark.distributed
def test_a_cache_too_small_for_the_training_split_keeps_the_prefix_resident(two_ranks: list[dict[str, Any]]) -> None:
    results = [r["small_cache"] for r in two_ranks]
    for rank, r in enumerate(results):
        assert [s["released"] for s in r["snaps"]] == [0, 0, 0]
        assert all(s["eval_bytes"] == 0 for s in r["snaps"])
        stage0 = [s for s in r["snaps"] if rank == 0 or s["layout"][1] == 1]  # the snapshots where it is stage 0
        assert len(stage0) >= 2 and not any(any(s["prefix_meta"]) for s in stage0)
    events = results[0]["result"]["transitions"]
    assert [t["cache"] for t in events] == [True, True]  # the cache is read (its misses recomputed)
    assert [t["prefix_released_bytes"] for t in events] == [0, 0]
