"""Each rank holds only what it runs: stage-only weights and optimizer state, transfers to new holders only,
evaluation through the layout, and a per-rank memory budget honoured end to end.

Pure tests check the transfer plan and the memory rule exactly; the gloo tests train a small ViT on 4 ranks
(4 -> 2 -> 1 stages) and compare each rank's bytes with its stage's share after every transition.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.groups import plan_spmd
from elastic_pipe.orchestrator import ConfigError, config_from_tables
from elastic_pipe.orchestrator.config import size_bytes
from elastic_pipe.orchestrator.layout.compression import COMPRESSION_RULES
from elastic_pipe.orchestrator.layout.rule import next_layout
from elastic_pipe.orchestrator.layout.start import MemoryBudget, initial_layout_within
from elastic_pipe.orchestrator.transition import Transfer, held_sublayers, plan_transfers
from elastic_pipe.testing import RankContext, run_distributed, run_tasks
from elastic_pipe.types import Layout


# ------------------------------------------------------------------------------------------------ transfer plans
def test_plan_transfers_for_4_to_2() -> None:
    old = Layout(0, 4, 1, (0, 2, 4, 6, 8), 4)
    new = Layout(3, 2, 2, (3, 5, 8), 4)
    # old stage s lives on rank s. New stage 0 = ranks {0, 2} (and the frozen prefix 0:3), stage 1 = ranks {1, 3}.
    assert plan_transfers(old, new, plan_spmd(4, 4), plan_spmd(4, 2)) == (
        Transfer(0, 2, (0, 1), optimizer_state=False),
        Transfer(1, 0, (2,), optimizer_state=False),
        Transfer(1, 0, (3,), optimizer_state=True),
        Transfer(1, 2, (2,), optimizer_state=False),
        Transfer(1, 2, (3,), optimizer_state=True),
        Transfer(2, 0, (4,), optimizer_state=True),
        Transfer(2, 1, (5,), optimizer_state=True),
        Transfer(2, 3, (5,), optimizer_state=True),
        Transfer(3, 1, (6, 7), optimizer_state=True),
    )
    assert held_sublayers(new, plan_spmd(4, 2), 2) == (0, 1, 2, 3, 4)
    assert held_sublayers(new, plan_spmd(4, 2), 3) == (5, 6, 7)


def test_a_source_in_the_receivers_new_pipeline_is_preferred() -> None:
    # 1 stage x 2 replicas -> 2 stages x 1 replica: ranks 0 and 1 both hold everything; rank 1 keeps what it needs
    old, new = Layout(0, 1, 2, (0, 4), 1), Layout(0, 2, 1, (0, 2, 4), 2)
    assert plan_transfers(old, new, plan_spmd(2, 1), plan_spmd(2, 2)) == ()
    # 2 stages x 2 replicas -> 1 stage x 4: rank 2 (stage 0 of replica 1) gets 2:4 from rank 3, its own replica's
    old, new = Layout(0, 2, 2, (0, 2, 4), 2), Layout(1, 1, 4, (1, 4), 1)
    transfers = plan_transfers(old, new, plan_spmd(4, 2), plan_spmd(4, 1))
    assert Transfer(3, 2, (2, 3), optimizer_state=True) in transfers
    assert Transfer(1, 0, (2, 3), optimizer_state=True) in transfers


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 11), min_size=3, max_size=3, unique=True),
    frozen=st.integers(0, 8),
    new_k=st.sampled_from([1, 2, 4]),
)
def test_every_new_holder_gets_exactly_what_it_lacks(cuts: list[int], frozen: int, new_k: int) -> None:
    n = 12
    old = Layout(0, 4, 1, (0, *sorted(cuts), n), 4)
    step = (n - frozen) / new_k
    bounds = (*(frozen + round(i * step) for i in range(new_k)), n)
    if len(set(bounds)) != len(bounds):
        return
    new = Layout(frozen, new_k, 4 // new_k, bounds, 4)
    old_plan, new_plan = plan_spmd(4, 4), plan_spmd(4, new_k)
    transfers = plan_transfers(old, new, old_plan, new_plan)
    got: dict[int, list[int]] = {r: [] for r in range(4)}
    for t in transfers:
        # a source holds what it sends; optimizer state travels exactly for sub-layers that stay active
        assert set(t.sublayers) <= set(held_sublayers(old, old_plan, t.src))
        assert all((j >= frozen) == t.optimizer_state for j in t.sublayers)
        got[t.dst].extend(t.sublayers)
    for rank in range(4):
        lacks = set(held_sublayers(new, new_plan, rank)) - set(held_sublayers(old, old_plan, rank))
        assert sorted(got[rank]) == sorted(lacks)  # everything it lacks, once, and nothing it has


def test_a_transition_cannot_thaw() -> None:
    from elastic_pipe.orchestrator import OrchestratorError

    with pytest.raises(OrchestratorError, match="unfreeze"):
        plan_transfers(Layout(2, 1, 2, (2, 8), 1), Layout(0, 1, 2, (0, 8), 1), plan_spmd(2, 1), plan_spmd(2, 1))


# ------------------------------------------------------------------------------------------------- memory budget
def test_byte_sizes_parse_and_bad_ones_are_named() -> None:
    assert size_bytes("40GiB", "pipeline.memory_budget") == 40 << 30
    assert size_bytes("512 MiB", "pipeline.memory_budget") == 512 << 20
    assert size_bytes("2.5GB", "pipeline.memory_budget") == 2_500_000_000
    assert size_bytes(4096, "pipeline.memory_budget") == 4096
    budget = config_from_tables({"model": {"name": "vit"}, "pipeline": {"memory_budget": "2.5GB"}}).pipeline
    assert budget.memory_budget_bytes == 2_500_000_000
    for bad in ("40 parsecs", "-1GiB", "0", "GiB", True, 0, 1.5):
        with pytest.raises(ConfigError, match="memory_budget"):
            config_from_tables({"model": {"name": "vit"}, "pipeline": {"memory_budget": bad}})
    with pytest.raises(ConfigError, match="'lots'"):
        config_from_tables({"model": {"name": "vit"}, "pipeline": {"memory_budget": "lots"}})


def test_stage_bytes_count_training_state_and_the_frozen_prefix_on_stage_0() -> None:
    memory = MemoryBudget.for_parameters(100, [10, 20, 30, 40], optimizer_slots=2)  # x4 while active
    assert memory.active == (40, 80, 120, 160) and memory.frozen == (10, 20, 30, 40)
    assert memory.stage_bytes(Layout(0, 2, 1, (0, 2, 4), 2)) == [120, 280]
    assert memory.stage_bytes(Layout(2, 1, 2, (2, 4), 1)) == [280 + 30]
    assert not memory.fits(Layout(0, 2, 1, (0, 2, 4), 2))


def test_the_initial_pipeline_is_the_shortest_that_fits() -> None:
    costs = [1.0] * 8
    memory = MemoryBudget.for_parameters(300, [100] * 8, optimizer_slots=0)  # 200 bytes per active sub-layer
    layout, _ = initial_layout_within(costs, (8, 4, 2, 1), 8, memory, solver="optimal", microbatches_for=lambda k: 2)
    assert (layout.pipe_len, layout.replicas) == (8, 1)
    roomier = MemoryBudget.for_parameters(800, [100] * 8, optimizer_slots=0)
    layout, _ = initial_layout_within(costs, (8, 4, 2, 1), 8, roomier, solver="optimal", microbatches_for=lambda k: 2)
    assert (layout.pipe_len, layout.replicas) == (2, 4)
    with pytest.raises(ConfigError, match=r"no pipeline length fits on 8 process\(es\).*1,600 bytes"):
        initial_layout_within(costs, (1,), 8, roomier, solver="optimal", microbatches_for=lambda k: 1)


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(500, 4000), frozen=st.integers(1, 6), rule=st.sampled_from(["halving", "memory"]))
def test_compression_never_picks_a_layout_over_the_budget(limit: int, frozen: int, rule: str) -> None:
    sizes = [60, 100, 100, 100, 100, 100, 100, 40]
    memory = MemoryBudget.for_parameters(limit, sizes, optimizer_slots=2)
    costs = [float(s) for s in sizes]
    current = Layout(0, 8, 1, tuple(range(9)), 2)
    if not memory.fits(current):
        return
    layout = next_layout(
        current,
        frozen,
        costs,
        compression=COMPRESSION_RULES[rule],
        solver="optimal",
        budget=300.0,
        world_size=8,
        memory=memory,
    )
    unbounded = next_layout(
        current, frozen, costs, compression=COMPRESSION_RULES[rule], solver="optimal", budget=300.0, world_size=8
    )
    assert memory.fits(layout)  # a fitting longer pipeline, or no change at all
    assert layout == current or (layout.frozen == frozen and layout.pipe_len >= unbounded.pipe_len)
    if memory.fits(unbounded):
        assert layout == unbounded  # the budget changes nothing when the rule's choice fits


# ------------------------------------------------------------------------------------------ training on 4 ranks
#: 10 sub-layers (embedding, 4 blocks of two, head); the manual schedule freezes 2 then 3 blocks, and halving
#: compresses the pipeline 4 -> 2 -> 1 (replicas 1 -> 2 -> 4).
MODEL = {"preset": "vit-tiny", "depth": 4, "dim": 32, "heads": 2, "mlp_dim": 64, "patch_size": 4}


def _config(overrides: dict[str, Any] | None = None) -> Any:
    tables: dict[str, Any] = {
        "model": {"name": "vit", "options": MODEL},
        "data": {"eval_fraction": 0.8},
        "train": {"epochs": 3, "dtype": "float64", "global_batch": 64, "optimizer": "adamw", "lr": 0.005},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 2, 2: 3}}},
        "pipeline": {"microbatches": 2, "pipe_len": 4, "solver": "optimal", "cache": "off"},
        "launch": {"nproc_per_node": 4},
        "log": {"progress": False},
    }
    return config_from_tables(tables).override(overrides or {})


def _snapshot(trainer: Any) -> dict[str, Any]:
    """What this rank holds now, and what its stage's share is."""
    from elastic_pipe.orchestrator.transition.holdings import held_bytes

    ctx, layout = trainer.ctx, trainer.state.layout
    held = ctx.held(layout)
    trained = [j for j in ctx.owned(layout) if j >= layout.frozen]
    sizes = ctx.param_bytes
    return {
        "layout": [layout.frozen, layout.pipe_len, list(layout.boundaries)],
        "held": list(held),
        **held_bytes(ctx, trainer.optimizer),
        "share_parameters": sum(sizes[j] for j in held),
        "share_optimizer": 2 * sum(sizes[j] for j in trained),  # AdamW: two moments per parameter
        "whole": sum(sizes),
    }


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _train_and_measure(ctx: RankContext) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.components import build_model

    config = _config()
    snaps: list[dict[str, Any]] = []
    received: list[int] = []

    def after_epoch(trainer: Any) -> None:
        before, now = snaps[-1], _snapshot(trainer)
        snaps.append(now)
        # what this rank received: the weights and buffers of what it newly holds, and the optimizer state of
        # those that stay active (the transition happened just before this callback; no step since)
        new = [j for j in now["held"] if j not in before["held"]]
        subs = trainer.ctx.sublayers
        mine = sum(_tensor_bytes([*subs[j].parameters(), *subs[j].buffers()]) for j in new)
        for j in new:
            for p in subs[j].parameters():
                mine += _tensor_bytes(v for v in trainer.optimizer.state.get(p, {}).values() if torch.is_tensor(v))
        total = torch.tensor([mine if before["layout"] != now["layout"] else 0])
        dist.all_reduce(total)
        received.append(int(total))

    with ElasticTrainer(config, quiet=True) as trainer:
        trainer.start()
        snaps.append(_snapshot(trainer))
        result = trainer.fit(on_epoch_end=after_epoch)
        full = trainer.full_state_dict()
        eval_set, loss_fn = trainer.ctx.eval_set, trainer.parts.loss
    out: dict[str, Any] = {"snaps": snaps, "received": received, "result": result.to_dict()}
    if ctx.rank == 0:  # the pipelined evaluation equals one process scoring the assembled model
        model = build_model(config)
        model.load_state_dict(full)
        model.eval()
        total, count = 0.0, 0
        positions = list(range(len(eval_set)))
        with torch.no_grad():
            for _, x, y in eval_set.batches([positions], inputs=True, labels=True, device=torch.device("cpu")):
                total += float(loss_fn(model(x), y)) * len(positions)
                count += len(positions)
        out["whole_model_eval_loss"] = total / count
    return out


@pytest.fixture(scope="module")
def four_ranks() -> list[dict[str, Any]]:
    """The 4-rank trainings of this module, one after the other in one job (starting 4 ranks on 2 cores costs about
    as much as a training); each builds its own trainers, as in a job of its own."""
    tight, roomy, _ = _budgets()
    tasks = {"measure": (_train_and_measure, ()), "within": (_train_within, (tight, roomy))}
    # the two jobs had 300 s and 400 s; the suite caps a job at 500 s, and both trainings take well under a minute
    return run_distributed(run_tasks, 4, tasks, timeout=500)


@pytest.mark.distributed
@pytest.mark.slow  # ~1 minute on 2 shared cores
def test_each_rank_holds_its_stage_and_transitions_move_only_what_new_holders_lack(
    four_ranks: list[dict[str, Any]],
) -> None:
    results = [r["measure"] for r in four_ranks]
    first = results[0]["result"]
    assert [(e["pipe_len"], e["replicas"]) for e in first["epochs"]] == [(4, 1), (2, 2), (1, 4)]
    for rank, r in enumerate(results):
        snaps = r["snaps"]
        assert [s["layout"][1] for s in snaps] == [4, 2, 1, 1]
        for s in snaps:
            # parameters: exactly the stage's sub-layers (and the frozen prefix on stage 0), never the whole model
            assert s["parameters"] == s["share_parameters"], (rank, s)
        assert snaps[0]["parameters"] < 0.5 * snaps[0]["whole"]
        for s in snaps[1:]:  # after a step: optimizer state of the owned trainable parameters only (+ AdamW's steps)
            assert s["optimizer"] == pytest.approx(s["share_optimizer"], rel=0.1), (rank, s)
            both = s["parameters"] + s["optimizer"]
            assert both == pytest.approx(s["share_parameters"] + s["share_optimizer"], rel=0.1)
    # a rank that holds less after a transition freed the rest: rank 1 ran stage 1 (2 sub-layers of 4 stages), then
    # stage 1 of 2, then everything active; rank 3 held the head's stage
    held = [[len(s["held"]) for s in r["snaps"]] for r in results]
    assert held[1][0] > 0 and all(h[-1] == 10 for h in held)  # 1 stage: every rank holds all (prefix + active)
    # the event's bytes are what the ranks really received, summed over the job
    moved = [t["bytes_moved"] for t in first["transitions"]]
    assert moved == results[0]["received"][:2] and all(m > 0 for m in moved)
    # ... which is less than sending every sub-layer to every rank would be
    whole = snaps[0]["whole"]
    assert moved[0] < 3 * 4 * whole
    # evaluation ran through the layout, and equals scoring the assembled model in one process (float64)
    assert first["final_eval_loss"] == pytest.approx(results[0]["whole_model_eval_loss"], rel=1e-9)
    assert all(r["result"]["losses"] == first["losses"] for r in results)


def _lose_and_regain(ctx: RankContext) -> dict[str, Any]:
    import torch

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.transition.holdings import held_bytes, hold, point_optimizer, transfer

    config = _config({"launch.nproc_per_node": 2, "pipeline.pipe_len": 2})
    with ElasticTrainer(config, quiet=True) as trainer:
        trainer.setup()
        tctx, opt = trainer.ctx, trainer.optimizer
        n = len(tctx.sublayers)
        whole, halves = Layout(0, 1, 2, (0, n), 1), Layout(0, 2, 1, (0, 4, n), 2)
        hold(tctx, whole)
        point_optimizer(tctx, opt, whole)
        before = {k: v.clone() for k, v in tctx.model.state_dict().items()}
        full = held_bytes(tctx)["parameters"]
        mine, total = transfer(tctx, whole, halves, opt)  # each rank keeps its half: nothing travels
        half = held_bytes(tctx)["parameters"]
        meta = [all(p.is_meta for p in tctx.sublayers[j].parameters()) for j in range(n)]
        back, back_total = transfer(tctx, halves, whole, opt)  # each rank gets the other half back
        after = tctx.model.state_dict()
        same = all(torch.equal(after[k], v) for k, v in before.items())
        return {
            "full": full,
            "half": half,
            "meta": meta,
            "moved": [mine, total, back, back_total],
            "same": same,
            "end": held_bytes(tctx)["parameters"],
            "share": sum(tctx.param_bytes[j] for j in tctx.owned(halves)),
        }


@pytest.mark.distributed
def test_a_rank_that_loses_sublayers_frees_them_and_gets_them_back_exactly() -> None:
    results = run_distributed(_lose_and_regain, 2, timeout=180)
    for rank, r in enumerate(results):
        assert r["half"] == r["share"] < r["full"] == r["end"]  # freed, then held again
        assert r["meta"] == [rank == 1] * 4 + [rank == 0] * (len(r["meta"]) - 4)  # the other stage is on meta
        assert r["same"]  # what came back is bit for bit what left (the ranks' copies were equal)
    # nothing moved into the split (each rank held both halves); the way back carries each rank the other's half
    assert [r["moved"][:2] for r in results] == [[0, 0], [0, 0]]
    assert results[0]["moved"][2] == results[1]["share"] and results[1]["moved"][2] == results[0]["share"]
    assert results[0]["moved"][3] == results[0]["share"] + results[1]["share"]


# --------------------------------------------------------------------------------------- the memory budget, end to end
def _budgets() -> tuple[int, int, Any]:
    """A budget only 4 stages fit (the whole training state exceeds it), one 2 stages fit, and the sizes."""
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.layout.start import initial_layout
    from elastic_pipe.orchestrator.setup import memory_budget, sublayer_costs

    config = _config()
    model = build_model(config)
    memory = memory_budget(config.override({"pipeline.memory_budget": 1}), model)
    assert memory is not None
    costs = sublayer_costs(model)
    need = {
        k: max(memory.stage_bytes(initial_layout(costs, k, 4, solver="optimal", microbatches=2)[0])) for k in (1, 2, 4)
    }
    assert need[4] < need[2] < need[1] == sum(memory.active)
    return need[4], need[2], memory


def _train_within(ctx: RankContext, tight: int, roomy: int) -> dict[str, Any]:
    from elastic_pipe.orchestrator import ElasticTrainer

    out: dict[str, Any] = {}
    for name, limit in (("tight", tight), ("roomy", roomy)):
        layouts: list[Any] = []
        with ElasticTrainer(_config({"pipeline.memory_budget": limit}), quiet=True) as trainer:
            trainer.start()
            layouts.append(trainer.state.layout)
            result = trainer.fit(on_epoch_end=lambda t, seen=layouts: seen.append(t.state.layout))
        out[name] = {"layouts": layouts, "losses": result.losses}
    return out


@pytest.mark.distributed
@pytest.mark.slow  # two 4-rank runs
def test_a_model_over_the_budget_trains_on_4_ranks_within_it(four_ranks: list[dict[str, Any]]) -> None:
    tight, roomy, memory = _budgets()
    results = [r["within"] for r in four_ranks]
    tight_run, roomy_run = results[0]["tight"], results[0]["roomy"]
    # the whole training state is over the budget, yet every layout the run took fits it on every rank
    assert sum(memory.active) > tight
    limited = MemoryBudget(tight, memory.active, memory.frozen)
    assert all(limited.fits(layout) for layout in tight_run["layouts"])
    assert tight_run["layouts"][0].pipe_len == 4
    assert tight_run["losses"][-1] < tight_run["losses"][0]
    # without the budget the same schedule compresses to one stage; with it, compression stopped earlier
    assert min(layout.pipe_len for layout in tight_run["layouts"]) > 1
    # the initial pipeline is the shortest that fits: 2 stages of the configured 4
    assert roomy_run["layouts"][0].pipe_len == 2
    assert all(MemoryBudget(roomy, memory.active, memory.frozen).fits(layout) for layout in roomy_run["layouts"])


def test_a_model_over_the_budget_is_refused_on_one_process_before_any_group_forms() -> None:
    import torch.distributed as dist

    from elastic_pipe.orchestrator import ElasticTrainer

    tight, _, memory = _budgets()
    config = _config({"pipeline.memory_budget": tight, "launch.nproc_per_node": 1, "pipeline.pipe_len": 1})
    trainer = ElasticTrainer(config, quiet=True)
    with pytest.raises(
        ConfigError, match=rf"memory_budget = {tight:,} bytes per rank: no pipeline length fits on 1"
    ) as e:
        trainer.setup()
    assert not dist.is_initialized()
    assert f"the whole training state is {sum(memory.active):,} bytes" in str(e.value)


def test_a_parameter_tied_across_sub_layers_is_refused_in_a_pipeline() -> None:
    import torch.distributed as dist

    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.setup import check_untied_stages
    from elastic_pipe.orchestrator.transition import shared_across_sublayers

    config = _config({"launch.nproc_per_node": 2, "pipeline.pipe_len": 2})
    model = build_model(config)
    assert shared_across_sublayers(model) == []
    names = [name for name, _ in model.named_children()]
    first, second = getattr(model, names[1]), getattr(model, names[3])  # two blocks' attention sub-layers
    second.norm.weight = first.norm.weight  # tie one parameter across two sub-layers, as a tied head does
    tied = [(f"{names[1]}.norm.weight", f"{names[3]}.norm.weight")]
    assert shared_across_sublayers(model) == tied
    with pytest.raises(ConfigError, match=rf"{tied[0][0]} and {tied[0][1]} are one tied parameter.*pipe_len = 1"):
        ElasticTrainer(config, model=model, quiet=True).setup()
    assert not dist.is_initialized()
    check_untied_stages(config.override({"launch.nproc_per_node": 1, "pipeline.pipe_len": 1}), model)  # one stage


def test_plan_applies_the_memory_budget_as_a_run_does() -> None:
    from elastic_pipe.orchestrator.dry_run import planned_epochs

    tight, roomy, memory = _budgets()
    unlimited = planned_epochs(_config())
    assert unlimited[0]["pipe_len"] == 4 and unlimited[-1]["pipe_len"] == 1  # the schedule compresses to one stage
    for limit, first in ((tight, 4), (roomy, 2)):
        planned = planned_epochs(_config({"pipeline.memory_budget": limit}))
        assert planned[0]["pipe_len"] == first  # the shortest length that fits, as the run starts
        budget = MemoryBudget(limit, memory.active, memory.frozen)
        layouts = [
            Layout(p["frozen"], p["pipe_len"], p["replicas"], tuple(p["boundaries"]), p["microbatches"])
            for p in planned
        ]
        assert all(budget.fits(layout) for layout in layouts)
    assert min(p["pipe_len"] for p in planned_epochs(_config({"pipeline.memory_budget": tight}))) > 1
