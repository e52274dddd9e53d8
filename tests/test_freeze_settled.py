"""The policy ``Settled`` (freeze a leading layer once its gradient stays far below its peak) and the held-out guard:
exact decisions on hand-made statistics, snapshots, and properties (never beyond the signal, monotone, capped,
resumable)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.freeze import POLICIES, FreezeError, HeldOutGuard, LayerStats, Settled, decide, make_policy
from elastic_pipe.freeze.settled import settled_streaks

FAST = settings(max_examples=60, deadline=None)


def _stats(l2: list[float], steps: int = 1) -> LayerStats:
    return LayerStats(tuple(1.0 for _ in l2), tuple(l2), steps)


def _run(policy: Settled, rounds: list[list[float]]) -> list[int]:
    frozen, plan = 0, []
    for epoch, norms in enumerate(rounds, start=1):
        policy.observe(_stats(norms))
        frozen = decide(policy, epoch, epoch * 10, frozen)
        plan.append(frozen)
    return plan


# --- the pure piece ---------------------------------------------------------------------------------------------


def test_settled_streaks_track_the_peak_and_count_low_intervals() -> None:
    # layer 0: 4 <= 0.5 * 10 (settled); 1: 6 > 5 (not); 2: new peak 12 (not); 3: 5 == 0.5 * 10 (settled, inclusive);
    # 4: never any gradient (settled)
    streaks, peaks = settled_streaks((1, 3, 2, 0, 4), (10.0, 10.0, 10.0, 10.0, 0.0), (4.0, 6.0, 12.0, 5.0, 0.0), 0.5)
    assert streaks == (2, 0, 0, 1, 5)
    assert peaks == (10.0, 10.0, 12.0, 10.0, 0.0)
    with pytest.raises(FreezeError, match="one of each per layer"):
        settled_streaks((0,), (1.0,), (1.0, 2.0), 0.5)


# --- decisions --------------------------------------------------------------------------------------------------


def test_freezes_one_settled_layer_per_decision_after_patience() -> None:
    policy = Settled(4, decay=0.5, patience=2, max_fraction=1.0, tolerance=None)
    rounds = [[10, 10, 10, 10], [4, 4, 4, 9], [4, 4, 4, 9], [4, 4, 4, 9], [4, 4, 4, 9], [4, 4, 4, 9]]
    # streaks after each round: 0000, 1110, 2220 (layer 0 ready), 3330, 4440, 5550; layer 3 never settles
    assert _run(policy, rounds) == [0, 0, 1, 2, 3, 3]


def test_a_settled_layer_waits_for_the_unsettled_layer_before_it() -> None:
    policy = Settled(3, patience=1, max_fraction=1.0, max_step=3, tolerance=None)
    assert _run(policy, [[10, 10, 10], [9, 1, 1], [1, 1, 1]]) == [0, 0, 3]


def test_max_step_and_the_cap() -> None:
    policy = Settled(6, patience=1, max_fraction=0.85, max_step=2, tolerance=None)  # cap floor(5.1) = 5
    assert _run(policy, [[10] * 6, [1] * 6, [1] * 6, [1] * 6, [1] * 6]) == [0, 2, 4, 5, 5]


def test_a_new_peak_resets_the_streak() -> None:
    policy = Settled(1, patience=2, max_fraction=1.0, tolerance=None)
    # 10 (peak), 4 (1), 20 (new peak, 0), 9 (1), 9 (2: frozen)
    assert _run(policy, [[10], [4], [20], [9], [9]]) == [0, 0, 0, 0, 1]


def test_reads_the_mean_gradient_so_intervals_of_any_length_compare() -> None:
    policy = Settled(1, patience=1, max_fraction=1.0, tolerance=None)
    policy.observe(_stats([100.0], steps=10))  # mean 10: the peak
    assert policy.propose(1, 10, 0) == 0
    policy.observe(_stats([60.0], steps=10))  # mean 6 > 5
    assert policy.propose(2, 20, 0) == 0
    policy.observe(_stats([50.0], steps=20))  # mean 2.5 <= 5
    assert policy.propose(3, 40, 0) == 1


def test_one_decision_per_observation() -> None:
    policy = Settled(3, patience=1, max_fraction=1.0, tolerance=None)
    policy.observe(_stats([10, 10, 10]))
    policy.observe(_stats([1, 1, 1]))
    assert policy.propose(1, 5, 0) == 1
    assert policy.propose(1, 6, 1) == 1  # no new statistics: nothing new
    policy.observe(_stats([1, 1, 1]))
    assert policy.propose(2, 10, 1) == 2


def test_default_configuration_and_registry() -> None:
    assert POLICIES["settled"] is Settled
    policy = make_policy("settled", 12)
    assert isinstance(policy, Settled) and policy.needs_stats
    assert (policy.decay, policy.patience, policy.max_fraction, policy.max_step, policy.tolerance) == (
        0.5,
        2,
        0.85,
        1,
        0.01,
    )
    with pytest.raises(FreezeError, match="decay must be in"):
        Settled(4, decay=1.0)
    with pytest.raises(FreezeError, match="patience must be an integer"):
        Settled(4, patience=0)
    with pytest.raises(FreezeError, match="max_fraction must be in"):
        Settled(4, max_fraction=0.0)
    with pytest.raises(FreezeError, match="tolerance must be a finite number"):
        Settled(4, tolerance=-1.0)
    with pytest.raises(FreezeError, match="expected 4 layers"):
        Settled(4).observe(_stats([1.0, 1.0]))


# --- the guard --------------------------------------------------------------------------------------------------


def test_guard_holds_while_the_loss_is_worse_than_the_best_by_more_than_the_tolerance() -> None:
    guard = HeldOutGuard(0.1)
    for loss, held in [(1.0, False), (1.05, False), (1.2, True), (1.3, True), (1.09, False), (0.5, False),
                       (float("nan"), True), (0.54, False)]:  # fmt: skip
        guard.observe(loss)
        assert guard.held is held, loss
    assert guard.best == 0.5
    off = HeldOutGuard(None)
    off.observe(float("inf"))
    assert off.held is False and off.best is None


def test_policy_freezes_nothing_new_while_the_guard_holds() -> None:
    policy = Settled(3, patience=1, max_fraction=1.0, tolerance=0.01)
    policy.observe(_stats([10, 10, 10]))
    policy.observe_eval(1.0)
    assert policy.propose(1, 1, 0) == 0  # no layer settled yet
    policy.observe(_stats([1, 1, 1]))
    policy.observe_eval(1.5)  # worse than the best 1.0 by 50%
    assert policy.propose(2, 2, 0) == 0
    policy.observe(_stats([1, 1, 1]))
    policy.observe_eval(0.9)
    assert policy.propose(3, 3, 0) == 1


# --- snapshots --------------------------------------------------------------------------------------------------


def test_snapshot_is_plain_json_and_refuses_another_configuration() -> None:
    policy = Settled(3, patience=1)
    policy.observe(_stats([10, 2, 3]))
    policy.observe_eval(0.7)
    state = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    assert state["peaks"] == [10.0, 2.0, 3.0] and state["streaks"] == [0, 0, 0] and state["best"] == 0.7
    fresh = Settled(3, patience=1)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == policy.state_dict()
    with pytest.raises(FreezeError, match="patience=1 in the snapshot, expected 2"):
        Settled(3).load_state_dict(state)


# --- properties -------------------------------------------------------------------------------------------------

norms = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
rounds_of = st.integers(min_value=1, max_value=6).flatmap(
    lambda n: st.lists(st.lists(norms, min_size=n, max_size=n), min_size=1, max_size=12)
)
configs = st.fixed_dictionaries(
    {
        "decay": st.sampled_from([0.2, 0.5, 0.8]),
        "patience": st.integers(1, 3),
        "max_fraction": st.sampled_from([0.5, 0.85, 1.0]),
        "max_step": st.integers(1, 3),
        "tolerance": st.sampled_from([None, 0.0, 0.05]),
        "plateau": st.sampled_from([None, 0.03]),
    }
).filter(lambda c: c["tolerance"] is not None or c["plateau"] is None)  # a plateau needs the guard on
losses = st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=12, max_size=12)


def _replay(config: dict[str, Any], rounds: list[list[float]]) -> list[tuple[int, ...]]:
    """Per decision, each layer's settled streak by the definition (the signal), computed independently."""
    n = len(rounds[0])
    peaks, streaks, out = [0.0] * n, [0] * n, []
    for norms_t in rounds:
        for i, v in enumerate(norms_t):
            peaks[i] = max(peaks[i], v)
            streaks[i] = streaks[i] + 1 if v <= config["decay"] * peaks[i] else 0
        out.append(tuple(streaks))
    return out


@FAST
@given(config=configs, rounds=rounds_of, evals=losses)
def test_never_freezes_beyond_the_signal_monotone_and_capped(
    config: dict[str, Any], rounds: list[list[float]], evals: list[float]
) -> None:
    n = len(rounds[0])
    policy = Settled(n, **config)
    signal = _replay(config, rounds)
    cap = int(config["max_fraction"] * n + 1e-9)
    frozen = 0
    for t, norms_t in enumerate(rounds):
        policy.observe(_stats(norms_t))
        policy.observe_eval(evals[t])
        new = decide(policy, t + 1, t + 1, frozen)
        assert frozen <= new <= max(frozen, cap)  # monotone, never past the cap
        assert new - frozen <= config["max_step"]
        assert all(signal[t][i] >= config["patience"] for i in range(frozen, new))  # only settled layers freeze
        frozen = new


@FAST
@given(config=configs, rounds=rounds_of, evals=losses, cut=st.integers(0, 12), between=st.booleans())
def test_resumes_from_a_json_snapshot_with_the_same_decisions(
    config: dict[str, Any], rounds: list[list[float]], evals: list[float], cut: int, between: bool
) -> None:
    n = len(rounds[0])

    def play(policy: Settled, start: int, frozen: int, *, skip_observe: bool = False) -> list[int]:
        plan = []
        for t in range(start, len(rounds)):
            if not (skip_observe and t == start):
                policy.observe(_stats(rounds[t]))
                policy.observe_eval(evals[t])
            frozen = decide(policy, t + 1, t + 1, frozen)
            plan.append(frozen)
        return plan

    whole = play(Settled(n, **config), 0, 0)
    cut = min(cut, len(rounds) - 1)
    first = Settled(n, **config)
    before = play(first, 0, 0)[:cut] if cut else []
    first = Settled(n, **config)
    frozen = 0
    for t in range(cut):
        first.observe(_stats(rounds[t]))
        first.observe_eval(evals[t])
        frozen = decide(first, t + 1, t + 1, frozen)
    if between:  # cut between an observation and its decision
        first.observe(_stats(rounds[cut]))
        first.observe_eval(evals[cut])
    second = Settled(n, **config)
    second.load_state_dict(json.loads(json.dumps(first.state_dict(), allow_nan=False)))
    assert before + play(second, cut, frozen, skip_observe=between) == whole


def test_plateau_guard_waits_for_the_held_out_loss_to_flatten() -> None:
    guard = HeldOutGuard(0.01, plateau=0.05)
    # first loss: no plateau yet; 0.8 improves by 20%: still learning; 0.78 by 2.5%: flat; 0.9: worse than the best
    for loss, held in [(1.0, True), (0.8, True), (0.78, False), (0.9, True), (0.785, False)]:
        guard.observe(loss)
        assert guard.held is held, loss
    with pytest.raises(FreezeError, match="needs the guard on"):
        HeldOutGuard(None, plateau=0.05)
    policy = Settled(2, patience=1, max_fraction=1.0, plateau=0.05)
    policy.observe(_stats([10, 10]))
    policy.observe(_stats([1, 1]))
    policy.observe_eval(1.0)
    assert policy.propose(1, 1, 0) == 0  # settled, but the held-out loss has not flattened yet
    policy.observe(_stats([1, 1]))
    policy.observe_eval(0.99)
    assert policy.propose(2, 2, 0) == 1
    assert policy.state_dict()["plateau"] == 0.05
