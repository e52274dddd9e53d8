"""Schedule IR, generators (golden files), validator, simulator formulas and property tests."""

from __future__ import annotations

import itertools
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.schedule import (
    GENERATORS,
    MAX_AUTO_VIRTUAL,
    Action,
    ActionKind,
    Schedule,
    ScheduleError,
    ScheduleTypeError,
    accepts,
    generate,
    refusal,
    simulate,
    validate,
)
from elastic_pipe.schedule.generators import MAX_ACTIONS
from elastic_pipe.schedule.ir import MAX_CHUNKS, MAX_MICROBATCHES, MAX_RANKS

GOLDEN = Path(__file__).parent / "golden" / "schedule"


# --- IR ----------------------------------------------------------------------------------------------------------


def test_action_text_round_trip() -> None:
    action = Action(2, ActionKind.F, 0)
    assert str(action) == "2F0"
    assert Action.parse("2F0") == action
    assert Action.parse(" 13W107 ") == Action(13, ActionKind.W, 107)
    assert [str(Action.parse(t)) for t in ("1B3", "0I1", "0W1")] == ["1B3", "0I1", "0W1"]


@pytest.mark.parametrize("text", ["", "2X0", "F0", "2F", "-1F0", "1SEND_F0", "1F0x"])
def test_action_parse_rejects_bad_text(text: str) -> None:
    with pytest.raises(ScheduleError, match="cannot parse action"):
        Action.parse(text)


def test_action_rejects_unknown_kind_and_negative_indices() -> None:
    with pytest.raises(ScheduleError, match="unknown action kind 'X'"):
        Action(0, "X", 0)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="stage >= 0"):
        Action(-1, ActionKind.F, 0)


def test_action_kind_values_are_torch_letters() -> None:
    assert [k.value for k in ActionKind] == ["F", "B", "I", "W"]
    assert Action(0, "B", 1).kind is ActionKind.B  # type: ignore[arg-type]


def test_schedule_text_round_trip_and_placement() -> None:
    schedule = generate("interleaved", 2, 4, 2)
    again = Schedule.from_text(schedule.to_text(), kind="interleaved")
    assert again.actions == schedule.actions
    assert (again.num_ranks, again.num_stages, again.microbatches) == (2, 4, 4)
    assert [schedule.stage_to_rank(s) for s in range(4)] == [0, 1, 0, 1]
    assert schedule.stages_of(1) == (1, 3)


def test_schedule_rejects_bad_shapes() -> None:
    with pytest.raises(ScheduleError, match=r"exactly the ranks 0\.\.1"):
        Schedule("x", 2, 2, 1, {0: ()})
    with pytest.raises(ScheduleError, match="every rank needs a stage"):
        Schedule("x", 3, 2, 1, {0: (), 1: (), 2: ()})
    with pytest.raises(ScheduleError, match="placement must map"):
        Schedule("x", 2, 2, 1, {0: (), 1: ()}, placement=(0, 2))
    with pytest.raises(ScheduleError, match="rank key 'a'"):
        Schedule.from_text({"a": ["0F0"]})
    with pytest.raises(ScheduleError, match="out of range"):
        generate("1f1b", 2, 2).stage_to_rank(2)


# --- generators: exact outputs -----------------------------------------------------------------------------------


def test_gpipe_and_1f1b_small_cases_by_hand() -> None:
    assert generate("gpipe", 2, 2).to_text() == {"0": ["0F0", "0F1", "0B0", "0B1"], "1": ["1F0", "1F1", "1B0", "1B1"]}
    assert generate("1f1b", 2, 3).to_text() == {
        "0": ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
        "1": ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    }


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_generators_match_golden_files(path: Path) -> None:
    golden = json.loads(path.read_text())
    schedule = generate(golden["kind"], golden["ranks"], golden["microbatches"], golden["chunks"])
    assert schedule.to_text() == golden["actions"]
    validate(schedule)


def test_golden_files_cover_every_generator() -> None:
    assert {json.loads(p.read_text())["kind"] for p in GOLDEN.glob("*.json")} == set(GENERATORS)


@pytest.mark.parametrize(
    ("kind", "ranks", "mbs", "chunks", "message"),
    [
        ("1f1b", 2, 4, 2, "1f1b holds one stage per rank"),
        ("zb1p", 2, 4, 3, "ZB-H1"),
        ("interleaved", 2, 4, 1, "chunks >= 2"),
        ("interleaved", 4, 6, 2, "multiple of ranks=4, got microbatches=6"),
        ("pipedream", 2, 4, 1, "expected one of gpipe, 1f1b, interleaved, zb1p"),
        ("gpipe", 0, 4, 1, "ranks must be an integer >= 1, got 0"),
        ("gpipe", 2, 0, 1, "microbatches must be an integer >= 1"),
    ],
)
def test_generators_refuse_with_the_constraint(kind: str, ranks: int, mbs: int, chunks: int, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        generate(kind, ranks, mbs, chunks)


# --- what each generator accepts (refusal, accepts) ----------------------------------------------------------------

#: Shapes at and past the generators' limits (only the refused ones are large: they are refused before any work).
LIMIT_SHAPES = [
    (MAX_RANKS, 1, 1),
    (MAX_RANKS + 1, 1, 1),
    (1, MAX_MICROBATCHES + 1, 1),
    (1, 1, MAX_CHUNKS),
    (1, 1, MAX_CHUNKS + 1),
    (MAX_RANKS, MAX_ACTIONS // (3 * MAX_RANKS) + 1, 1),
    (2, 4, 2**40),
]


def _generated(kind: str, ranks: int, mbs: int, chunks: int) -> str | None:
    """What calling the generator says: None when it builds a schedule (a valid one), else its error's message."""
    try:
        schedule = generate(kind, ranks, mbs, chunks)
    except ScheduleError as exc:
        return str(exc)
    if ranks * mbs * chunks <= 1_000:
        validate(schedule)  # every action once, in dependency order, no deadlock
    return None


def _documented(kind: str, ranks: int, mbs: int, chunks: int) -> bool:
    """docs/schedule.md's table of what each generator accepts, within the limits every generator keeps."""
    within = ranks <= MAX_RANKS and mbs <= MAX_MICROBATCHES and chunks <= MAX_CHUNKS
    own = {"gpipe": True, "1f1b": chunks == 1, "zb1p": chunks == 1, "interleaved": chunks >= 2 and mbs % ranks == 0}
    return within and 3 * ranks * mbs * chunks <= MAX_ACTIONS and own[kind]


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_refusal_answers_as_the_generator_over_a_grid(kind: str) -> None:
    grid = [*itertools.product(range(1, 5), range(1, 7), range(1, MAX_AUTO_VIRTUAL + 2)), *LIMIT_SHAPES]
    for ranks, mbs, chunks in grid:
        reason = refusal(kind, ranks, mbs, chunks)
        assert reason == _generated(kind, ranks, mbs, chunks), (kind, ranks, mbs, chunks)
        assert accepts(kind, ranks, mbs, chunks) is (reason is None) is _documented(kind, ranks, mbs, chunks)
        if reason is None:
            if ranks * mbs * chunks <= 1_000:  # the generator called directly builds the same schedule
                assert generate(kind, ranks, mbs, chunks).actions == {
                    r: tuple(a) for r, a in GENERATORS[kind](ranks, mbs, chunks).items()
                }
        else:
            assert "\n" not in reason
            with pytest.raises(ScheduleError, match=re.escape(reason)):  # and refuses with the same reason
                GENERATORS[kind](ranks, mbs, chunks)


def test_refusal_names_the_limit_a_count_passes() -> None:
    assert refusal("gpipe", MAX_RANKS + 1, 1) == f"ranks must be an integer <= {MAX_RANKS}, got {MAX_RANKS + 1}"
    assert refusal("gpipe", 2, 4, 2**40) == f"chunks must be an integer <= {MAX_CHUNKS}, got {2**40}"
    assert "above the limit of" in str(refusal("1f1b", MAX_RANKS, MAX_RANKS))
    assert (
        refusal("interleaved", 4, 6, 2)
        == "interleaved needs microbatches to be a multiple of ranks=4, got microbatches=6"
    )


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("pipedream", 2, 4, 1), ScheduleError, "unknown schedule kind 'pipedream': expected one of"),
        ((3, 2, 4, 1), ScheduleTypeError, "kind must be a string"),
        (("gpipe", 0, 4, 1), ScheduleError, "ranks must be an integer >= 1, got 0"),
        (("gpipe", 2, -1, 1), ScheduleError, "microbatches must be an integer >= 1, got -1"),
        (("gpipe", 2, 4, 0), ScheduleError, "chunks must be an integer >= 1, got 0"),
        (("gpipe", 2.0, 4, 1), ScheduleTypeError, "ranks must be an integer"),
        (("gpipe", 2, "4", 1), ScheduleTypeError, "microbatches must be an integer"),
        (("gpipe", 10**30, 4, 1), ScheduleError, "ranks must be an integer <= 9223372036854775807"),  # no int64
    ],
)
def test_refusal_and_accepts_raise_on_bad_arguments(args: tuple[object, ...], error: type, message: str) -> None:
    for ask in (refusal, accepts):
        with pytest.raises(error, match=message):
            ask(*args)  # type: ignore[arg-type]


def test_every_kind_runs_some_v_that_auto_tries() -> None:
    # the planner and the layout rule start "auto" from the fewest v the schedule runs: there is one for every kind
    for kind in GENERATORS:
        assert any(accepts(kind, 1, 1, v) for v in range(1, MAX_AUTO_VIRTUAL + 1)), kind


# --- validator -----------------------------------------------------------------------------------------------------


def _text(actions: dict[str, list[str]], stages: int = 2, mbs: int = 1) -> Schedule:
    return Schedule.from_text(actions, num_stages=stages, microbatches=mbs)


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ({"0": ["0F0", "0B0"], "1": ["1B0", "1F0"]}, "backward runs before its forward"),
        ({"0": ["0F0", "0B0"], "1": ["1F0"]}, r"no complete backward: expected 1B0, or 1I0 and 1W0"),
        ({"0": ["0B0"], "1": ["1F0", "1B0"]}, r"no forward \(0F0\)"),
        ({"0": ["0F0", "0F0", "0B0"], "1": ["1F0", "1B0"]}, "runs 0F0 twice"),
        ({"0": ["0F0", "0B0"], "1": ["1F0", "1I0", "1B0", "1W0"]}, "both a full backward B and a split backward"),
        ({"0": ["0F0", "0B0"], "1": ["1F0", "1W0", "1I0"]}, "1W0 runs before 1I0"),
        ({"0": ["0F0", "1F0", "0B0"], "1": ["1B0"]}, "stage 1 is on rank 1"),
        ({"0": ["0F0", "0B0", "0F1"], "1": ["1F0", "1B0"]}, "out of range"),
    ],
)
def test_validator_names_the_problem(actions: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate(_text(actions))


def test_validator_rejects_non_actions() -> None:
    bad = Schedule("x", 1, 1, 1, {0: ("0F0", Action(0, ActionKind.B, 0))})  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match=r"rank 0 action #0 is '0F0': expected an Action"):
        validate(bad)


def test_validator_detects_deadlock() -> None:
    # rank 0 waits for 0B0 (needs 1B0) before it sends 0F1; rank 1 wants 1F1 before 1B0
    actions = {"0": ["0F0", "0B0", "0F1", "0B1"], "1": ["1F0", "1F1", "1B0", "1B1"]}
    with pytest.raises(ScheduleError, match=r"deadlocks.*rank 0 waits at 0B0.*rank 1 waits at 1F1"):
        validate(_text(actions, mbs=2))


def test_validator_accepts_split_backward_by_hand() -> None:
    schedule = _text({"0": ["0F0", "0I0", "0W0"], "1": ["1F0", "1I0", "1W0"]})
    validate(schedule)  # raises ScheduleError if it were refused
    sim = simulate(schedule, forward=1.0, backward=2.0, input_grad=1.0, weight_grad=1.0)
    # 0F0 [0,1], 1F0 [1,2], 1I0 [2,3], then 1W0 [3,4] beside 0I0 [3,4] (it needed 1I0's gradient), 0W0 [4,5]
    assert sim.makespan == 5.0
    assert sim.busy == (3.0, 3.0)


# --- simulator: published formulas -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 8), (4, 4), (4, 16), (8, 3), (5, 7)])
def test_bubble_of_gpipe_and_1f1b_is_p_minus_1_over_m_plus_p_minus_1(kind: str, p: int, m: int) -> None:
    sim = simulate(generate(kind, p, m), forward=1.0, backward=2.0)
    assert Fraction(sim.bubble_fraction).limit_denominator(1000) == Fraction(p - 1, m + p - 1)
    assert sim.makespan == 3.0 * (m + p - 1)
    assert sim.busy == (3.0 * m,) * p


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 9, 3), (4, 4, 2)])
def test_interleaved_bubble_is_divided_by_the_chunk_count(p: int, m: int, v: int) -> None:
    # a chunk costs 1/v of a rank's share, so ideal time m*(f+b) and each rank idles (p-1)(f+b)/v
    f, b = 1.0, 2.0
    sim = simulate(generate("interleaved", p, m, v), forward=f / v, backward=b / v)
    for idle in sim.idle:
        assert idle == pytest.approx((p - 1) * (f + b) / v, rel=1e-12)
    assert sim.makespan == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-12)
    one_f_one_b = simulate(generate("1f1b", p, m), forward=f, backward=b)
    assert sim.bubble_fraction < one_f_one_b.bubble_fraction


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (6, 12), (8, 32)])
def test_zb_h1_idles_a_third_of_1f1b_at_the_same_peak_memory(p: int, m: int) -> None:
    # equal F, I, W (so B = I + W = 2): 1F1B idles (p-1)(F+I+W), ZB-H1 (p-1)(F+I-W)
    zb = simulate(generate("zb1p", p, m), forward=1.0, backward=2.0, input_grad=1.0, weight_grad=1.0)
    base = simulate(generate("1f1b", p, m), forward=1.0, backward=2.0)
    assert zb.idle == (float(p - 1),) * p
    assert base.idle == (3.0 * (p - 1),) * p
    assert max(zb.peak_activations) == max(base.peak_activations) == min(p, m)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (6, 3), (3, 3)])
def test_1f1b_activation_peak_is_min_p_minus_s_m(p: int, m: int) -> None:
    sim = simulate(generate("1f1b", p, m), 1.0, 2.0)
    assert sim.peak_activations == tuple(min(p - s, m) for s in range(p))
    assert simulate(generate("gpipe", p, m), 1.0, 2.0).peak_activations == (m,) * p


def test_per_stage_costs_transfer_and_overhead() -> None:
    # 2 stages, 1 micro-batch: F0 (1) -> hop (0.5) -> F1 (2) -> B1 (4) -> hop -> B0 (3), each +0.25 overhead
    sim = simulate(generate("gpipe", 2, 1), forward=[1.0, 2.0], backward=[3.0, 4.0], transfer=0.5, overhead=0.25)
    assert sim.makespan == pytest.approx(1.25 + 0.5 + 2.25 + 4.25 + 0.5 + 3.25)
    assert sim.busy == pytest.approx((4.5, 6.5))
    assert [round(s, 6) for s in sim.starts[1]] == [1.75, 4.0]
    assert list(sim.intervals(0))[1][0] == Action(0, ActionKind.B, 0)


def test_split_backward_defaults_to_halves() -> None:
    sim = simulate(generate("zb1p", 1, 2), forward=1.0, backward=2.0)
    assert sim.makespan == 6.0
    assert sim.bubble_fraction == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"forward": [1.0, 2.0, 3.0]}, "forward needs 1 or 2 values, got 3"),
        ({"backward": -1.0}, "backward must be finite and >= 0, got -1.0"),
        ({"transfer": [0.1, 0.2]}, "transfer needs 1 or 1 values, got 2"),
        ({"overhead": float("nan")}, "overhead must be finite"),
    ],
)
def test_simulate_rejects_bad_costs(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"forward": 1.0, "backward": 2.0, **kwargs}
    with pytest.raises(ScheduleError, match=message):
        simulate(generate("1f1b", 2, 2), **args)  # type: ignore[arg-type]


def test_simulate_reports_deadlock() -> None:
    bad = _text({"0": ["0F0", "0B0", "0F1", "0B1"], "1": ["1F0", "1F1", "1B0", "1B1"]}, mbs=2)
    with pytest.raises(ScheduleError, match="deadlocks"):
        simulate(bad, 1.0, 1.0)


def test_simulation_to_dict() -> None:
    doc = simulate(generate("1f1b", 2, 2), 1.0, 1.0).to_dict()
    assert doc == {
        "kind": "1f1b",
        "ranks": 2,
        "stages": 2,
        "microbatches": 2,
        "makespan": 6.0,
        "bubble_fraction": pytest.approx(1 / 3),
        "busy": [4.0, 4.0],
        "idle": [2.0, 2.0],
        "peak_activations": [2, 1],
    }


# --- properties ----------------------------------------------------------------------------------------------------


@st.composite
def _valid_params(draw: st.DrawFn) -> tuple[str, int, int, int]:
    kind = draw(st.sampled_from(sorted(GENERATORS)))
    p = draw(st.integers(1, 8))
    if kind == "interleaved":
        return kind, p, p * draw(st.integers(1, 4)), draw(st.integers(2, 4))
    chunks = draw(st.integers(1, 3)) if kind == "gpipe" else 1
    return kind, p, draw(st.integers(1, 20)), chunks


@settings(max_examples=60, deadline=None)
@given(params=_valid_params(), costs=st.lists(st.floats(0.01, 10.0), min_size=4, max_size=4))
def test_every_generated_schedule_validates_and_simulates(
    params: tuple[str, int, int, int], costs: list[float]
) -> None:
    kind, p, m, v = params
    schedule = generate(kind, p, m, v)
    validate(schedule)
    assert schedule.num_stages == p * v
    f, b, i, w = costs
    sim = simulate(schedule, f, b, input_grad=i, weight_grad=w, transfer=0.1)
    assert 0.0 <= sim.bubble_fraction < 1.0
    assert len(sim.peak_activations) == p * v
    assert all(1 <= peak <= m for peak in sim.peak_activations)
    # no rank can finish before its own work, nor the pipeline before one micro-batch's critical path
    assert sim.makespan >= max(sim.busy) - 1e-9
    assert sim.makespan >= (p * v) * f + (p * v - 1) * 0.1 * (p > 1) - 1e-9
    # every action starts after its rank's previous action ends
    for rank in range(p):
        spans = list(zip(sim.starts[rank], sim.ends[rank], strict=True))
        assert all(e0 <= s1 + 1e-12 for (_, e0), (s1, _) in itertools.pairwise(spans))
