"""``[pipeline] virtual = "auto"`` (issue #43): the one choice of v (:func:`choose_virtual`), the config key, the
layout rule that calls the choice at every layout it makes, and ``elastic-pipe plan`` printing it. Pure, no
processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_pipe.cli import main
from elastic_pipe.freeze import ManualSchedule
from elastic_pipe.orchestrator import ConfigError, components_from_config, config_from_tables
from elastic_pipe.orchestrator.layout.compression import COMPRESSION_RULES
from elastic_pipe.orchestrator.layout.rule import decide_units, layout_sequence, next_layout, with_virtual
from elastic_pipe.orchestrator.layout.start import initial_layout
from elastic_pipe.orchestrator.layout.virtual_choice import (
    AutoVirtual,
    choose_virtual,
    virtual_rule,
    virtual_steps,
)
from elastic_pipe.planner import (
    ClusterSpec,
    GpuSpec,
    JobSpec,
    Plan,
    PlannerError,
    SubLayerCost,
    format_table,
    make_plan,
    plan_to_dict,
)
from elastic_pipe.schedule import MAX_AUTO_VIRTUAL
from elastic_pipe.types import Layout

TINY = {"name": "vit", "options": {"preset": "vit-tiny", "depth": 2, "dim": 16, "heads": 2, "mlp_dim": 32}}
EQUAL = [1.0] * 16


# --- choose_virtual ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "interleaved"])
def test_a_bubble_that_dominates_picks_the_largest_v(schedule: str) -> None:
    steps = virtual_steps(EQUAL, 4, 4, schedule, solver="optimal", hop_share=0.0)
    # no per-hop cost: every extra stage per rank only cuts the bubble
    assert steps[4].makespan < min(steps[v].makespan for v in steps if v != 4)
    assert steps[4].bubble_fraction < steps[min(steps)].bubble_fraction
    assert choose_virtual(EQUAL, 4, 4, schedule, solver="optimal", hop_share=0.0) == MAX_AUTO_VIRTUAL


def test_a_per_hop_cost_that_dominates_picks_one_stage_per_rank() -> None:
    assert choose_virtual(EQUAL, 4, 4, "gpipe", solver="optimal", hop_share=0.0) == 4
    assert choose_virtual(EQUAL, 4, 4, "gpipe", solver="optimal", hop_share=10.0) == 1
    # interleaved runs no v = 1: the per-hop cost leaves it the smallest it runs
    assert choose_virtual(EQUAL, 4, 4, "interleaved", solver="optimal", hop_share=10.0) == 2


def test_one_rank_has_no_bubble_so_v_stays_one() -> None:
    steps = virtual_steps(EQUAL, 1, 4, "gpipe", solver="optimal", hop_share=0.0)
    assert [round(s.makespan, 9) for s in steps.values()] == [
        192.0
    ] * 4  # 16 sub-layers x (F + 2F) x 4 micro-batches: a tie, broken towards the smaller v
    assert choose_virtual(EQUAL, 1, 4, "gpipe", solver="optimal", hop_share=0.0) == 1
    assert choose_virtual(EQUAL, 1, 4, "gpipe", solver="optimal") == 1  # the default hop cost makes v > 1 dearer


@pytest.mark.parametrize(
    ("schedule", "allowed"),
    [("1f1b", [1]), ("zb1p", [1]), ("gpipe", [1, 2, 3, 4]), ("interleaved", [2, 3, 4])],
)
def test_only_the_v_the_schedule_runs_are_tried(schedule: str, allowed: list[int]) -> None:
    assert sorted(virtual_steps(EQUAL, 2, 4, schedule, solver="optimal")) == allowed
    assert choose_virtual(EQUAL, 2, 4, schedule, solver="optimal") in allowed


def test_every_stage_keeps_a_sub_layer() -> None:
    # 6 active sub-layers on K = 2: at most v = 3
    assert sorted(virtual_steps([1.0] * 6, 2, 4, "gpipe", solver="optimal", hop_share=0.0)) == [1, 2, 3]
    assert choose_virtual([1.0] * 6, 2, 4, "gpipe", solver="optimal", hop_share=0.0) == 3
    # 3 active sub-layers on K = 2: interleaved fits no v, so the smallest it runs (the rule then shortens K)
    assert virtual_steps([1.0] * 3, 2, 4, "interleaved", solver="optimal") == {}
    assert choose_virtual([1.0] * 3, 2, 4, "interleaved", solver="optimal") == 2
    assert choose_virtual([1.0] * 16, 2, 4, "gpipe", solver="optimal", hop_share=0.0, most=2) == 2


def test_the_choice_is_a_pure_function_of_its_inputs() -> None:
    costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    first = [choose_virtual(costs, k, 2 * k, "gpipe", solver="greedy") for k in (1, 2, 4)]
    assert first == [choose_virtual(costs, k, 2 * k, "gpipe", solver="greedy") for k in (1, 2, 4)]
    assert first[0] == 1


def test_the_config_value_becomes_the_rule() -> None:
    assert virtual_rule(3, "gpipe") == 3
    rule = virtual_rule("auto", "interleaved")
    assert rule == AutoVirtual("interleaved") and isinstance(rule, AutoVirtual) and rule.fewest == 2
    assert AutoVirtual("gpipe").fewest == AutoVirtual("1f1b").fewest == 1


# --- the layout rule -------------------------------------------------------------------------------------------


def test_the_layout_rule_chooses_v_for_every_layout_it_makes() -> None:
    auto = AutoVirtual("gpipe", hop_share=0.0)
    costs = [1.0] * 8
    start, budget = initial_layout(costs, 2, 2, solver="optimal", microbatches=2, virtual=auto)
    assert start == Layout(0, 2, 1, (0, 1, 2, 3, 4, 5, 6, 7, 8), 2, virtual=4)
    # halving to one rank: no bubble left, v = 1
    halved = next_layout(
        start, 5, costs, compression=COMPRESSION_RULES["halving"], solver="optimal", budget=budget, world_size=2,
        virtual=auto,
    )  # fmt: skip
    assert halved == Layout(5, 1, 2, (5, 8), 2)
    # the length kept: 3 active sub-layers hold 2 ranks x 1 stage at most
    kept = next_layout(
        start, 5, costs, compression=COMPRESSION_RULES["none"], solver="optimal", budget=budget, world_size=2,
        virtual=auto,
    )  # fmt: skip
    assert kept == Layout(5, 2, 1, (5, 7, 8), 2)
    # a fixed v is kept as before, with or without the keyword
    fixed = Layout(0, 2, 1, (0, 2, 4, 6, 8), 2, virtual=2)
    same = dict(compression=COMPRESSION_RULES["none"], solver="optimal", budget=4.0, world_size=2)
    assert next_layout(fixed, 3, costs, **same) == next_layout(fixed, 3, costs, **same, virtual=2)  # type: ignore[arg-type]
    # a resume chooses the same v for the saved layout, which it keeps
    assert with_virtual(start, auto, costs, solver="optimal", world_size=2, microbatches_for=lambda k: 2) is start
    assert with_virtual(fixed, auto, costs, solver="optimal", world_size=2, microbatches_for=lambda k: 2) == start


def test_the_freeze_cap_leaves_room_for_the_fewest_stages_the_schedule_runs() -> None:
    def cap(virtual: int | AutoVirtual) -> int:
        return decide_units(
            ManualSchedule(7, {1: 7}), epoch=1, step=1, current=0, unit_ends=(1, 2, 3, 4, 5, 6, 7), num_sublayers=8,
            pipe_len=2, compression=COMPRESSION_RULES["none"], virtual=virtual,
        )  # fmt: skip

    assert cap(AutoVirtual("gpipe")) == cap(1) == 6
    assert cap(AutoVirtual("interleaved")) == cap(2) == 4


def test_layout_sequence_records_the_chosen_v_per_epoch() -> None:
    sequence = layout_sequence(
        [1.0] * 8, (1, 2, 3, 4, 5, 6, 7), ManualSchedule(7, {1: 5}), epochs=2, steps_per_epoch=1, pipe_len=2,
        world_size=2, compression=COMPRESSION_RULES["halving"], solver="optimal", microbatches_for=lambda k: 2,
        virtual=AutoVirtual("gpipe", hop_share=0.0),
    )  # fmt: skip
    assert [(x.pipe_len, x.virtual) for _, x in sequence] == [(2, 4), (1, 1)]


# --- the config ------------------------------------------------------------------------------------------------


def test_the_config_takes_auto_or_a_positive_int() -> None:
    assert config_from_tables({"model": TINY, "pipeline": {"virtual": "auto"}}).pipeline.virtual == "auto"
    assert config_from_tables({"model": TINY, "pipeline": {"virtual": 3}}).pipeline.virtual == 3
    for bad in ("Auto", "2", 0, -1, 1.5, True):
        with pytest.raises(ConfigError, match=r"pipeline.virtual must be an integer >= 1 or 'auto', got ") as info:
            config_from_tables({"model": TINY, "pipeline": {"virtual": bad}})
        assert "\n" not in str(info.value)


def test_auto_is_refused_only_where_the_schedule_runs_no_v() -> None:
    for schedule in ("gpipe", "1f1b", "zb1p", "interleaved"):
        components_from_config(
            config_from_tables({"model": TINY, "pipeline": {"schedule": schedule, "virtual": "auto"}})
        )
    tables = {"pipeline": {"schedule": "interleaved", "virtual": "auto", "pipe_len": 2, "microbatches": 3}}
    config = config_from_tables(
        {"model": TINY, "launch": {"nproc_per_node": 2}, "train": {"global_batch": 48}, **tables}
    )
    with pytest.raises(ConfigError, match=r"virtual = 'auto': .*multiple of ranks=2") as info:
        components_from_config(config)
    assert "\n" not in str(info.value)


# --- elastic-pipe plan --config ----------------------------------------------------------------------------------

CONFIG = """
[model]
name = "vit"
options = {{ preset = "vit-tiny", depth = 2, dim = 16, heads = 2, mlp_dim = 32 }}

[train]
epochs = 2
global_batch = 32

[freeze]
policy = "manual"
options = {{ schedule = {{ 1 = 2 }} }}

[pipeline]
pipe_len = 2
schedule = "gpipe"
compression = "halving"
microbatches = 2
solver = "optimal"
virtual = {virtual}

[launch]
nproc_per_node = 2
"""


def test_plan_config_prints_the_v_the_rule_chose_per_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "auto.toml"
    path.write_text(CONFIG.format(virtual='"auto"'), encoding="utf-8")
    assert main(["plan", "--config", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["virtual"] == "auto"
    assert [(e["pipe_len"], e["virtual"]) for e in doc["epochs"]] == [(2, 3), (1, 1)]
    assert len(doc["epochs"][0]["boundaries"]) == 2 * 3 + 1
    assert main(["plan", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("schedule gpipe, v = auto chosen per layout by the layout rule;")
    rows = [line.split() for line in text.splitlines()[2:4]]
    assert [(r[3], r[4]) for r in rows] == [("2", "3"), ("1", "1")]  # the K and v columns


# --- the planner: JobSpec(virtual="auto"), elastic-pipe plan --virtual auto ---------------------------------------

NO_FIXED_COSTS = GpuSpec(
    host_overhead=0.0, data_overhead=0.0, pass_overhead=0.0, optimizer_overhead=0.0, optimizer_sublayer_overhead=0.0
)


def _uniform(n: int, *, hop_latency: float = 0.0) -> Plan:
    costs = [
        SubLayerCost(
            f"l{i}",
            unit=i if i < n - 1 else None,
            params=0,
            forward=1e-3,
            backward=2e-3,
            frozen_forward=1e-3,
            output_bytes=0.0,
            stored_bytes=0.0,
        )
        for i in range(n)
    ]
    job = JobSpec(64, 1, 10, frozen=(0,), pipe_len=4, microbatches=4, schedule="gpipe", virtual="auto")
    return make_plan(costs, ClusterSpec(4, gpu=NO_FIXED_COSTS, p2p_latency=hop_latency), job, model="uniform")


def test_an_auto_job_tries_the_v_its_schedule_runs() -> None:
    assert JobSpec(8, 1, 1, schedule="gpipe", virtual="auto").virtual_candidates == (1, 2, 3, 4)
    assert JobSpec(8, 1, 1, schedule="interleaved", virtual="auto").virtual_candidates == (2, 3, 4)
    assert JobSpec(8, 1, 1, schedule="zb1p", virtual="auto").virtual_candidates == (1,)
    assert JobSpec(8, 1, 1, schedule="interleaved", virtual="auto").chunks == 2  # the layout search's v
    # the planner tries what the training run's rule tries: every v up to the one limit both read
    assert JobSpec(8, 1, 1, schedule="gpipe", virtual="auto").virtual_candidates[-1] == MAX_AUTO_VIRTUAL
    assert AutoVirtual("gpipe").most == MAX_AUTO_VIRTUAL
    with pytest.raises(PlannerError, match=r"JobSpec\.virtual must be an int"):
        JobSpec(8, 1, 1, virtual="many")


def test_the_plan_chooses_the_fastest_v_and_reports_the_others() -> None:
    plan = _uniform(16)
    (epoch,) = plan.epochs
    options = {p.chunks: p for p in epoch.virtual_options}
    assert sorted(options) == [1, 2, 3, 4] and epoch.interleaved is None
    # equal stages and no per-pass cost: the bubble alone decides, and 4 stages per rank leave the least
    assert epoch.virtual == 4 and epoch.step.step_time == min(p.step_time for p in options.values())
    assert options[4].breakdown.bubble < options[2].breakdown.bubble < options[1].breakdown.bubble
    doc = plan_to_dict(plan)["epochs"][0]
    assert [(o["virtual"], o["chosen"]) for o in doc["virtual_options"]] == [
        (1, False),
        (2, False),
        (3, False),
        (4, True),
    ]
    assert doc["virtual_options"][0]["step_time"] == options[1].step_time
    table = format_table(plan)
    assert "[v=1: " in table and "v=4: " not in table.split("virtual = auto")[0].split("[", 1)[1]
    assert "virtual = auto: v is the fastest of 1, 2, 3, 4" in table


def test_a_per_hop_latency_that_dominates_keeps_one_stage_per_rank() -> None:
    (epoch,) = _uniform(16, hop_latency=0.05).epochs
    assert epoch.virtual == 1
    assert all(p.step_time > epoch.step.step_time for p in epoch.virtual_options if p.chunks != 1)


def test_plan_virtual_auto_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "vit-b16", "--gpus", "8", "--epochs", "2", "--pipe-len", "4", "--schedule", "gpipe"]
    assert main([*base, "--virtual", "auto", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"]["virtual"] == "auto"
    first = doc["epochs"][0]
    assert [o["virtual"] for o in first["virtual_options"]] == [1, 2, 3, 4]
    (chosen,) = [o for o in first["virtual_options"] if o["chosen"]]
    assert chosen["virtual"] == first["virtual"] and chosen["step_time"] == first["step_time"]
    assert first["step_time"] == min(o["step_time"] for o in first["virtual_options"] if o["fits"])
    assert main([*base, "--virtual", "auto"]) == 0
    assert "virtual = auto: v is the fastest of 1, 2, 3, 4" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # argparse's own type check: one line, exit 2
        main([*base, "--virtual", "lots"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a stage count or 'auto', got 'lots'" in err
