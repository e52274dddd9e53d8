"""The probe-driven policy ``Drift`` (freeze a leading layer once its output on a fixed probe batch stops changing)
and its signal (``OutputDrift``, ``relative_change``): exact decisions and measurements on hand-made inputs,
snapshots, and properties (never beyond the signal, monotone, capped, resumable)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.freeze import (
    POLICIES,
    Drift,
    FreezeError,
    OutputDrift,
    decide,
    make_policy,
    needs_probe,
    relative_change,
    signal_layers,
)
from elastic_pipe.freeze.drift import quiet_streaks

FAST = settings(max_examples=60, deadline=None)

#: Drift's defaults before the accuracy study's setting replaced them (no relative or settle test, one layer per
#: decision, the guard on): the tests of each piece of the signal start from them and add the piece they test.
PLAIN: dict[str, Any] = {
    "threshold": 0.01,
    "relative": None,
    "settle": None,
    "settle_after": None,
    "patience": 2,
    "max_fraction": 0.85,
    "max_step": 1,
    "tolerance": 0.01,
}


def plain(num_layers: int, **options: Any) -> Drift:
    """A :class:`Drift` with :data:`PLAIN` options, ``options`` overriding them."""
    return Drift(num_layers, **{**PLAIN, **options})


def _run(policy: Drift, rounds: list[list[float]]) -> list[int]:
    frozen, plan = 0, []
    for t, change in enumerate(rounds, start=1):
        policy.observe_drift(change)
        frozen = decide(policy, t, t * 10, frozen)
        plan.append(frozen)
    return plan


# --- the signal -------------------------------------------------------------------------------------------------


def test_relative_change_is_the_root_of_the_ratio_of_squares() -> None:
    assert relative_change([9.0, 0.0, 0.0, 2.0], [100.0, 4.0, 0.0, 0.0]) == (0.3, 0.0, 0.0, math.inf)
    with pytest.raises(FreezeError, match="2 distances but 1"):
        relative_change([1.0, 1.0], [1.0])
    with pytest.raises(FreezeError, match="layer 0"):
        relative_change([-1.0], [1.0])
    with pytest.raises(FreezeError, match="layer 0"):
        relative_change([math.nan], [1.0])


def test_output_drift_measures_the_change_since_the_previous_call() -> None:
    drift = OutputDrift()
    first = drift.measure({1: torch.tensor([[3.0, 4.0]]), 2: torch.ones(2, 2)}, 4)
    assert first == ((0.0, math.inf, math.inf, 0.0), (0.0, 0.0, 0.0, 0.0))  # nothing to compare with yet
    assert drift.held == (1, 2)
    # layer 1: (3, 4) -> (3, 5): distance^2 1, previous norm^2 25 -> change 0.2; layer 2 forgotten (frozen)
    second = drift.measure({1: torch.tensor([[3.0, 5.0]])}, 4)
    assert second == ((0.0, 1.0, 0.0, 0.0), (0.0, 25.0, 0.0, 0.0))
    assert relative_change(*second)[1] == pytest.approx(0.2)
    assert drift.held == (1,)
    # the kept output is a copy: changing the tensor handed in changes nothing
    h = torch.tensor([[3.0, 5.0]])
    drift.measure({1: h}, 4)
    h.add_(100.0)
    assert drift.measure({1: torch.tensor([[3.0, 5.0]])}, 4)[0][1] == 0.0
    with pytest.raises(FreezeError, match="shape"):
        drift.measure({1: torch.zeros(3)}, 4)
    with pytest.raises(FreezeError, match="outside"):
        drift.measure({4: torch.zeros(1)}, 4)
    drift.reset()
    assert drift.held == ()


def test_pieces_of_two_stages_sum_to_the_whole_model_measurement() -> None:
    torch.manual_seed(0)
    before = {i: torch.randn(3, 5) for i in range(4)}
    after = {i: before[i] + 0.1 * torch.randn(3, 5) for i in range(4)}
    whole, first, second = OutputDrift(), OutputDrift(), OutputDrift()
    whole.measure(before, 4)
    first.measure({0: before[0], 1: before[1]}, 4)
    second.measure({2: before[2], 3: before[3]}, 4)
    w = whole.measure(after, 4)
    a = first.measure({0: after[0], 1: after[1]}, 4)
    b = second.measure({2: after[2], 3: after[3]}, 4)
    merged = [tuple(x + y for x, y in zip(p, q, strict=True)) for p, q in zip(a, b, strict=True)]
    assert relative_change(*merged) == pytest.approx(relative_change(*w))
    expected = [float((after[i] - before[i]).norm() / before[i].norm()) for i in range(4)]
    assert relative_change(*w) == pytest.approx(expected, rel=1e-6)


def test_outputs_of_several_shapes_and_dtypes_are_each_measured_against_their_own_previous_output() -> None:
    # measure stacks the outputs that share a shape and dtype: mixed kinds (an embedding's output, blocks in
    # bfloat16, a pooled head) must still each meet their own previous output, in any key order
    torch.manual_seed(1)
    kinds = {0: (2, 3, 4), 1: (2, 3, 4), 2: (5,), 3: (2, 3, 4), 4: ()}
    dtypes = {0: torch.float32, 1: torch.bfloat16, 2: torch.float32, 3: torch.bfloat16, 4: torch.float64}
    before = {i: torch.randn(kinds[i]).to(dtypes[i]) for i in (3, 0, 4, 2, 1)}
    after = {i: (h.double() + (i + 1) * 0.05 * torch.randn(kinds[i])).to(dtypes[i]) for i, h in before.items()}
    drift = OutputDrift()
    drift.measure(before, 5)
    diff_sq, ref_sq = drift.measure(after, 5)
    for i in range(5):
        old, new = before[i].float(), after[i].float()
        assert diff_sq[i] == pytest.approx(float((new - old).square().sum()), rel=1e-6), i
        assert ref_sq[i] == pytest.approx(float(old.square().sum()), rel=1e-6), i
    # the kept outputs keep their dtype and bits, not a shared one
    assert {i: h.dtype for i, h in drift.state_dict().items()} == dtypes
    assert all(torch.equal(drift.state_dict()[i], after[i]) for i in range(5))


# --- the pure pieces --------------------------------------------------------------------------------------------


def test_quiet_streaks_count_still_intervals_inclusively() -> None:
    # 0.005 <= 0.01 (still); 0.01 == threshold (still, inclusive); 0.02 (busy: reset); inf (no comparison: reset)
    assert quiet_streaks((2, 0, 5, 1), (0.005, 0.01, 0.02, math.inf), 0.01) == (3, 1, 0, 0)
    with pytest.raises(FreezeError, match="one per layer"):
        quiet_streaks((0,), (0.0, 0.0), 0.01)
    with pytest.raises(FreezeError, match="change\\[0\\]"):
        quiet_streaks((0,), (-0.1,), 0.01)


# --- decisions --------------------------------------------------------------------------------------------------


def test_freezes_one_still_layer_per_decision_after_patience() -> None:
    policy = plain(4, threshold=0.01, patience=2, max_fraction=1.0, tolerance=None)
    rounds = [[0.005, 0.008, 0.02, 0.3]] + [[0.004, 0.006, 0.009, 0.2]] * 4
    # streaks: 1100, 2210 (layer 0 ready), 3320, 4430, 5540; layer 3 keeps moving
    assert _run(policy, rounds) == [0, 1, 2, 3, 3]


def test_a_still_layer_waits_for_the_moving_layer_before_it_and_the_cap_binds() -> None:
    policy = plain(3, patience=1, max_fraction=1.0, max_step=3, tolerance=None)
    assert _run(policy, [[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]) == [0, 3]
    capped = plain(6, patience=1, max_step=2, tolerance=None)  # cap floor(0.85 * 6) = 5
    assert capped.signal_layers == 5 and signal_layers(capped) == 5
    assert _run(capped, [[0.0] * 6] * 4) == [2, 4, 5, 5]


def test_one_decision_per_observation_and_the_guard_holds() -> None:
    policy = plain(2, patience=1, max_fraction=1.0, tolerance=0.01)
    policy.observe_drift([0.0, 0.0])
    policy.observe_eval(1.0)
    assert policy.propose(1, 10, 0) == 1
    assert policy.propose(1, 11, 1) == 1  # no new observation: nothing new
    policy.observe_drift([0.0, 0.0])
    policy.observe_eval(1.02)  # worse than 1.0 by more than 1%: the guard holds
    assert policy.propose(2, 20, 1) == 1
    policy.observe_drift([0.0, 0.0])
    policy.observe_eval(1.005)  # back within the band
    assert policy.propose(3, 30, 1) == 2


def test_relative_freezes_the_layers_that_move_much_less_than_the_top_from_the_first_interval() -> None:
    """With ``relative``, a layer is still while it moves by at most that share of the highest watched layer, at
    any learning rate: here layers 0 and 1 move by a tenth and a quarter of layer 3, layer 2 by two thirds."""
    policy = plain(4, threshold=0.0, relative=0.3, patience=1, max_fraction=1.0, max_step=4, tolerance=None)
    rounds = [[0.03, 0.075, 0.2, 0.3], [0.0, 0.0, 0.2, 0.3], [0.0, 0.0, 0.05, 0.3]]
    assert _run(policy, rounds) == [2, 2, 3]
    first = plain(4, threshold=0.0, relative=0.3, patience=1, max_fraction=1.0, tolerance=None)
    assert _run(first, [[0.0001, 0.0001, 0.2, math.inf]]) == [0]  # the top has no baseline: nothing relative
    top = plain(2, threshold=0.0, relative=0.9, patience=1, max_fraction=1.0, tolerance=None)
    assert _run(top, [[0.1, 0.1]]) == [0]  # the top layer is never still relative to itself (nor layer 0 here)


def test_settle_freezes_everything_once_the_top_has_slowed_to_a_share_of_its_peak() -> None:
    """With ``settle``, every layer is still in an interval where the highest watched layer moves by at most that
    share of the most it has moved; with ``max_step`` L everything below the head freezes at once."""
    policy = plain(3, threshold=0.0, settle=0.2, patience=2, max_fraction=1.0, max_step=3, tolerance=None)
    tops = [math.inf, 1.0, 0.5, 0.15, 0.3, 0.18, 0.1]
    # peak 1.0 from the second interval: still at 0.15, moving at 0.3 (streak reset), still at 0.18 and 0.1
    assert _run(policy, [[0.5, 0.5, t] for t in tops]) == [0, 0, 0, 0, 0, 0, 3]
    state = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    assert state["settle"] == 0.2 and state["top_peak"] == 1.0 and "relative" not in state


def test_settle_after_keeps_the_settle_test_out_of_the_first_part_of_the_run() -> None:
    """With ``settle_after``, the settle test counts only at decision points from that share of ``total_steps``
    on (steps 10, 20, ... here, of 100: from step 60); before it, a layer is still only by its own tests."""
    rounds = [[0.5, 0.5, t] for t in [1.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]]
    early = plain(3, threshold=0.0, settle=0.2, patience=1, max_fraction=1.0, max_step=3, tolerance=None)
    assert _run(early, rounds) == [0, 3, 3, 3, 3, 3, 3]  # settled from the second interval on
    late = plain(
        3, threshold=0.0, settle=0.2, settle_after=0.6, total_steps=100, patience=1, max_fraction=1.0, max_step=3,
        tolerance=None,
    )  # fmt: skip
    assert _run(late, rounds) == [0, 0, 0, 0, 0, 3, 3]
    # the layers' own tests go on deciding before it: layer 0 is still by the threshold from the start
    own = plain(3, threshold=0.6, settle=0.2, settle_after=0.6, total_steps=100, patience=1, max_fraction=1.0,
                max_step=3, tolerance=None)  # fmt: skip
    assert _run(own, [[0.5, 0.7, t] for t in [1.0, 0.1, 0.1, 0.1, 0.1, 0.1]]) == [1, 1, 1, 1, 1, 3]
    # with patience 2 the settled intervals before the floor count once the floor is reached
    patient = plain(3, threshold=0.0, settle=0.2, settle_after=0.5, total_steps=100, patience=2, max_fraction=1.0,
                    max_step=3, tolerance=None)  # fmt: skip
    assert _run(patient, rounds) == [0, 0, 0, 0, 3, 3, 3]
    state = json.loads(json.dumps(late.state_dict(), allow_nan=False))
    assert (state["settle_after"], state["total_steps"], state["unsettled"]) == (0.6, 100, [0, 0, 0])
    again = plain(3, threshold=0.0, settle=0.2, settle_after=0.6, total_steps=100, patience=1, max_fraction=1.0,
                  max_step=3, tolerance=None)  # fmt: skip
    again.load_state_dict(state)
    assert again.state_dict() == state
    with pytest.raises(FreezeError, match="total_steps=100 in the snapshot, expected 200"):
        plain(3, threshold=0.0, settle=0.2, settle_after=0.6, total_steps=200, patience=1, max_fraction=1.0,
              max_step=3, tolerance=None).load_state_dict(state)  # fmt: skip
    with pytest.raises(FreezeError, match="unsettled"):
        again.load_state_dict({**state, "unsettled": [0, -1, 0]})


def test_the_runtime_fills_in_total_steps_for_a_policy_that_takes_it() -> None:
    from elastic_pipe.freeze import takes_total_steps

    assert takes_total_steps(Drift) and takes_total_steps(POLICIES["freezeout"])
    assert not takes_total_steps(POLICIES["alpha"]) and not takes_total_steps(len)


def test_a_snapshot_keeps_relative_settle_and_the_peak_and_old_snapshots_still_load() -> None:
    policy = plain(3, relative=0.3, settle=0.25, patience=1, max_fraction=1.0)
    policy.observe_drift([0.01, 0.5, 0.8])
    state = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    again = plain(3, relative=0.3, settle=0.25, patience=1, max_fraction=1.0)
    again.load_state_dict(state)
    assert again.state_dict() == state and again._top_peak == 0.8
    with pytest.raises(FreezeError, match="settle"):
        plain(3, relative=0.3, settle=0.5, patience=1, max_fraction=1.0).load_state_dict(state)
    with pytest.raises(FreezeError, match="top_peak"):
        again.load_state_dict({**state, "top_peak": -1.0})
    before = plain(3, patience=1)
    before.observe_drift([0.0, 0.5, 0.8])
    old = json.loads(json.dumps(before.state_dict()))  # a snapshot from before the options existed
    assert "relative" not in old and "settle" not in old and "top_peak" not in old
    plain(3, patience=1).load_state_dict(old)


def test_reads_no_gradient_statistics_and_asks_for_the_probe() -> None:
    policy = make_policy("drift", 12, total_steps=200)
    assert POLICIES["drift"] is Drift and isinstance(policy, Drift)
    assert policy.needs_stats is False and needs_probe(policy) and policy.decisions_per_epoch == 4


def test_the_defaults_are_the_setting_the_study_measured() -> None:
    """relative 0.15, settle 0.3 from 80% of the run, threshold 0.01, patience 1, the lower two thirds, no step
    limit, no guard (docs/freeze.md, "The default policy"); the run's length is needed for settle_after."""
    policy = Drift(12, total_steps=200)
    assert (policy.threshold, policy.relative, policy.settle, policy.settle_after) == (0.01, 0.15, 0.3, 0.8)
    assert (policy.patience, policy.max_fraction, policy.max_step, policy.tolerance) == (1, 0.67, 12, None)
    # the top third keeps training: floor(2/3 L) may freeze (4 of MiniLM-L6's 6 blocks, 8 of ViT-B/16's 12)
    assert [signal_layers(Drift(n, total_steps=200)) for n in (1, 2, 3, 6, 12, 19, 24)] == [0, 1, 2, 4, 8, 12, 16]
    with pytest.raises(FreezeError, match=r"settle_after = 0\.8 needs total_steps"):
        Drift(12)
    assert Drift(12, settle_after=None).settle_after is None  # no floor: no run length needed
    assert Drift(12, settle=None).settle_after is None  # nothing to delay
    # the two tasks' shapes, in miniature: a network whose lower layers barely move freezes them at once, the
    # others only once the top has settled, from step 160 of 200 on; one that moves as a whole waits for that
    # (the top third, past the cap, is not watched: the relative test reads the highest watched layer, the fourth)
    encoder, whole = Drift(6, total_steps=200), Drift(6, total_steps=200)
    tops = [1.0, 0.8, 0.5, 0.2, 0.2, 0.2]
    steps = [20, 40, 80, 140, 160, 180]
    assert _decide(encoder, [[0.05, 0.1, 0.6 * t, t, 9.0, 9.0] for t in tops], steps) == [2, 2, 2, 2, 4, 4]
    assert _decide(whole, [[0.5 * t, 0.7 * t, 0.8 * t, t, 9.0, 9.0] for t in tops], steps) == [0, 0, 0, 0, 4, 4]


def _decide(policy: Drift, rounds: list[list[float]], steps: list[int]) -> list[int]:
    frozen, plan = 0, []
    for change, step in zip(rounds, steps, strict=True):
        policy.observe_drift(change)
        frozen = decide(policy, 0, step, frozen)
        plan.append(frozen)
    return plan

    assert not needs_probe(make_policy("settled", 12))
    assert signal_layers(make_policy("autofreeze", 12)) == 12


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"threshold": -0.1}, "threshold must be a finite number >= 0"),
        ({"threshold": math.inf}, "threshold must be a finite number >= 0"),
        ({"patience": 0}, "patience must be an integer >= 1"),
        ({"max_fraction": 0.0}, r"max_fraction must be in \(0, 1\]"),
        ({"max_fraction": 1.2}, r"max_fraction must be in \(0, 1\]"),
        ({"max_step": 0}, "max_step must be an integer >= 1"),
        ({"tolerance": -1.0}, "tolerance must be a finite number >= 0 or None"),
        ({"tolerance": None, "plateau": 0.1}, "needs the guard on"),
        ({"relative": 0.0}, r"relative must be a number in \(0, 1\) or None"),
        ({"relative": 1.0}, r"relative must be a number in \(0, 1\) or None"),
        ({"settle": True}, r"settle must be a number"),
        ({"settle": 0.2, "settle_after": 0.0, "total_steps": 10}, r"settle_after must be a number in \(0, 1\]"),
        ({"settle": 0.2, "settle_after": 1.5, "total_steps": 10}, r"settle_after must be a number in \(0, 1\]"),
        ({"settle": 0.2, "settle_after": 0.5}, "settle_after = 0.5 needs total_steps"),
        ({"settle": 0.2, "settle_after": 0.5, "total_steps": 0}, "total_steps must be an integer >= 1"),
    ],
)
def test_bad_options_are_refused_naming_the_value(options: dict[str, Any], match: str) -> None:
    with pytest.raises(FreezeError, match=match):
        plain(4, **options)


def test_observe_drift_checks_its_input() -> None:
    policy = plain(3)
    with pytest.raises(FreezeError, match="got 2 changes, expected 3"):
        policy.observe_drift([0.0, 0.0])
    with pytest.raises(FreezeError, match="change\\[1\\]"):
        policy.observe_drift([0.0, math.nan, 0.0])


def test_snapshot_is_plain_json_and_refuses_another_configuration() -> None:
    policy = plain(3, patience=1, max_fraction=1.0)
    policy.observe_drift([0.001, 0.5, math.inf])
    policy.observe_eval(0.7)
    state = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    assert state["streaks"] == [1, 0, 0] and state["fresh"] is True and state["best"] == 0.7
    again = plain(3, patience=1, max_fraction=1.0)
    again.load_state_dict(state)
    assert again.state_dict() == policy.state_dict() and again.propose(1, 1, 0) == 1
    with pytest.raises(FreezeError, match="patience=1 in the snapshot, expected 2"):
        plain(3, max_fraction=1.0).load_state_dict(state)
    with pytest.raises(FreezeError, match="streaks"):
        plain(3, patience=1, max_fraction=1.0).load_state_dict({**state, "streaks": [1, 0]})


# --- properties -------------------------------------------------------------------------------------------------

changes = st.one_of(st.floats(min_value=0.0, max_value=0.05, allow_nan=False), st.just(math.inf))
rounds_of = st.integers(min_value=1, max_value=6).flatmap(
    lambda n: st.lists(st.lists(changes, min_size=n, max_size=n), min_size=1, max_size=12)
)
configs = (
    st.fixed_dictionaries(
        {
            "threshold": st.sampled_from([0.0, 0.01, 0.03]),
            "patience": st.integers(1, 3),
            "max_fraction": st.sampled_from([0.5, 0.85, 1.0]),
            "max_step": st.integers(1, 3),
            "tolerance": st.sampled_from([None, 0.0, 0.05]),
            "plateau": st.sampled_from([None, 0.03]),
            "relative": st.sampled_from([None, 0.3, 0.6]),
            "settle": st.sampled_from([None, 0.2, 0.5]),
            "settle_after": st.sampled_from([None, 0.5]),
        }
    )
    .filter(lambda c: c["tolerance"] is not None or c["plateau"] is None)
    .map(lambda c: {**c, "settle_after": None} if c["settle"] is None else c)
    .map(lambda c: {**c, "total_steps": 12} if c["settle_after"] is not None else c)
)
losses = st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=12, max_size=12)


def _signal(config: dict[str, Any], rounds: list[list[float]]) -> list[tuple[int, ...]]:
    """Per decision (at steps 1, 2, ...), each layer's still streak by the definition (the signal), computed
    independently: still when at most ``threshold``, or at most ``relative`` times the highest watched layer's
    change, or when that layer's change is at most ``settle`` times the largest it has shown (with ``settle_after``,
    the streaks without that test decide before ``settle_after * total_steps``)."""
    n = len(rounds[0])
    top = int(config["max_fraction"] * n + 1e-9) - 1
    relative, settle = config.get("relative"), config.get("settle")
    floor = (config["settle_after"] or 0.0) * config.get("total_steps", 0)
    streaks, unsettled, out, peak = [0] * n, [0] * n, [], 0.0
    for t, change in enumerate(rounds, start=1):
        c_top = change[top] if top >= 0 else math.inf
        settled = False
        if settle is not None and math.isfinite(c_top):
            peak = max(peak, c_top)
            settled = c_top <= settle * peak
        own = [
            c <= config["threshold"]
            or (relative is not None and math.isfinite(c_top) and c_top > 0 and layer < top and c <= relative * c_top)
            for layer, c in enumerate(change)
        ]
        streaks = [s + 1 if ok or settled else 0 for s, ok in zip(streaks, own, strict=True)]
        unsettled = [s + 1 if ok else 0 for s, ok in zip(unsettled, own, strict=True)]
        out.append(tuple(streaks if t >= floor else unsettled))
    return out


@FAST
@given(config=configs, rounds=rounds_of, evals=losses)
def test_never_freezes_beyond_the_signal_monotone_and_capped(
    config: dict[str, Any], rounds: list[list[float]], evals: list[float]
) -> None:
    n = len(rounds[0])
    policy = Drift(n, **config)
    signal = _signal(config, rounds)
    cap = int(config["max_fraction"] * n + 1e-9)
    frozen = 0
    for t, change in enumerate(rounds):
        policy.observe_drift(change)
        policy.observe_eval(evals[t])
        new = decide(policy, t + 1, t + 1, frozen)
        assert frozen <= new <= max(frozen, cap)  # monotone, never past the cap
        assert new - frozen <= config["max_step"]
        assert all(signal[t][i] >= config["patience"] for i in range(frozen, new))  # only still layers freeze
        frozen = new


@FAST
@given(config=configs, rounds=rounds_of, evals=losses, cut=st.integers(0, 12), between=st.booleans())
def test_resumes_from_a_json_snapshot_with_the_same_decisions(
    config: dict[str, Any], rounds: list[list[float]], evals: list[float], cut: int, between: bool
) -> None:
    n = len(rounds[0])
    cut = min(cut, len(rounds) - 1)

    def play(policy: Drift, start: int, frozen: int, *, skip_observe: bool = False) -> list[int]:
        plan = []
        for t in range(start, len(rounds)):
            if not (skip_observe and t == start):
                policy.observe_drift(rounds[t])
                policy.observe_eval(evals[t])
            frozen = decide(policy, t + 1, t + 1, frozen)
            plan.append(frozen)
        return plan

    whole = play(Drift(n, **config), 0, 0)
    first = Drift(n, **config)
    frozen = 0
    for t in range(cut):
        first.observe_drift(rounds[t])
        first.observe_eval(evals[t])
        frozen = decide(first, t + 1, t + 1, frozen)
    if between:  # cut between an observation and its decision
        first.observe_drift(rounds[cut])
        first.observe_eval(evals[cut])
    second = Drift(n, **config)
    second.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert whole[:cut] + play(second, cut, frozen, skip_observe=between) == whole


def test_a_dry_run_refuses_the_probe_driven_policy() -> None:
    from elastic_pipe.freeze import frozen_by_epoch

    with pytest.raises(FreezeError, match="drift of a probe batch's outputs"):
        frozen_by_epoch(plain(4), 3)
