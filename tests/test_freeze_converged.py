"""The convergence-aware policy ``Converged``: exact decisions on hand-made statistics, the held-out guard, its
snapshot, and properties (only converged layers of a prefix freeze, monotone, capped, resumable)."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.freeze import (
    POLICIES,
    AutoFreeze,
    Converged,
    FreezeError,
    HeldOutGuard,
    LayerStats,
    decide,
    make_policy,
)
from elastic_pipe.freeze.converged import converged_prefix, max_frozen, next_streaks

FAST = settings(max_examples=60, deadline=None)


def _stats(l2: list[float], steps: int = 1) -> LayerStats:
    """Statistics whose L2 norms are ``l2`` summed over ``steps`` steps (the policy reads ``l2 / steps``)."""
    return LayerStats(tuple(1.0 for _ in l2), tuple(l2), steps)


def _run(policy: Converged, rounds: list[list[float]]) -> list[int]:
    """Observe each round's norms and decide once after each; return the decisions."""
    frozen, plan = 0, []
    for epoch, norms in enumerate(rounds, start=1):
        policy.observe(_stats(norms))
        frozen = decide(policy, epoch, epoch * 10, frozen)
        plan.append(frozen)
    return plan


# --- the pure pieces --------------------------------------------------------------------------------------------


def test_next_streaks_counts_consecutive_quiet_intervals() -> None:
    # change rates 0.04, 0.05 (not below), 0.5, 0 (0 -> 0), inf (0 -> 1)
    assert next_streaks((2, 2, 2, 2, 2), (10.0, 10.0, 10.0, 0.0, 0.0), (10.4, 10.5, 5.0, 0.0, 1.0), 0.05) == (
        3,
        0,
        0,
        3,
        0,
    )
    with pytest.raises(FreezeError, match="one of each per layer"):
        next_streaks((0,), (1.0, 1.0), (1.0, 1.0), 0.05)


def test_converged_prefix_stops_at_the_first_unconverged_layer_the_step_and_the_cap() -> None:
    streaks = (5, 5, 1, 5, 5, 5)
    assert converged_prefix(streaks, 0, 3, 6, 6) == 2  # layer 2 is still moving
    assert converged_prefix(streaks, 0, 3, 6, 1) == 1  # one layer per decision
    assert converged_prefix(streaks, 3, 3, 6, 6) == 6
    assert converged_prefix(streaks, 3, 3, 5, 6) == 5  # the cap
    assert converged_prefix(streaks, 5, 3, 4, 6) == 5  # already past the cap: nothing new
    assert converged_prefix(streaks, 6, 3, 6, 6) == 6


def test_max_frozen_leaves_the_last_quarter_active_by_default() -> None:
    assert [max_frozen(n, 0.75) for n in (1, 2, 3, 4, 6, 12)] == [0, 1, 2, 3, 4, 9]
    assert max_frozen(100, 0.29) == 29  # 0.29 * 100 is 28.999999999999996 in binary64
    assert max_frozen(12, 1.0) == 12


# --- exact decisions --------------------------------------------------------------------------------------------


def test_freezes_one_converged_layer_per_decision_up_to_the_cap() -> None:
    quiet = [10.4, 10.0, 5.0, 10.0]
    rounds = [[10.0, 10.0, 10.0, 10.0], [10.0, 10.0, 5.0, 10.0], quiet, quiet, quiet, quiet, quiet]
    # streaks after each round: 0000, 1101, 2212 (10 -> 10.4 is a 4% change), 3323, 4434, 5545, 6656
    # layer 0 reaches patience 3 in round 4, layer 2 in round 5; the cap floor(0.75 * 4) = 3 keeps layer 3 active
    assert _run(Converged(4), rounds) == [0, 0, 0, 1, 2, 3, 3]


def test_a_converged_layer_waits_for_the_moving_layer_before_it() -> None:
    policy = Converged(4, patience=1, max_fraction=1.0, max_step=4)
    rounds = [[1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    # layer 0 doubles, then halves: its streak is 0 until round 4; layers 1..3 are quiet from round 2 on
    assert _run(policy, rounds) == [0, 0, 0, 4]


def test_max_step_freezes_several_layers_at_once() -> None:
    policy = Converged(6, patience=2, max_fraction=1.0, max_step=2)
    assert _run(policy, [[3.0] * 6] * 6) == [0, 0, 2, 4, 6, 6]


def test_a_change_equal_to_the_threshold_is_not_quiet() -> None:
    policy = Converged(2, patience=1, max_fraction=1.0, max_step=2)
    assert _run(policy, [[10.0, 10.0], [10.0, 10.5]]) == [0, 1]  # layer 1 changed by exactly 5%: it stays


def test_reads_the_mean_gradient_so_intervals_of_any_length_compare() -> None:
    policy = Converged(2, patience=1, max_fraction=1.0, max_step=2)
    policy.observe(_stats([1.0, 1.0], steps=1))
    assert decide(policy, 1, 1, 0) == 0
    policy.observe(_stats([4.0, 8.0], steps=4))  # means 1 and 2: layer 0 is quiet, layer 1 doubled
    assert decide(policy, 2, 5, 0) == 1


def test_one_decision_per_observation() -> None:
    policy = Converged(4, patience=1, max_fraction=1.0)
    policy.observe(_stats([1.0] * 4))
    policy.observe(_stats([1.0] * 4))
    assert decide(policy, 1, 10, 0) == 1
    assert decide(policy, 1, 11, 1) == 1  # no statistics since the last decision: nothing new
    policy.observe(_stats([1.0] * 4))
    assert decide(policy, 2, 20, 1) == 2


def test_layers_frozen_by_someone_else_are_kept() -> None:
    policy = Converged(4)
    policy.observe(_stats([1.0] * 4))
    assert decide(policy, 1, 10, 4) == 4  # past the cap already: monotone, so it stays


def test_rejects_stats_of_the_wrong_size() -> None:
    with pytest.raises(FreezeError, match="expected 4 layers"):
        Converged(4).observe(LayerStats.zeros(3, steps=1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"threshold": 0.0}, "threshold must be a finite number > 0"),
        ({"threshold": math.inf}, "threshold must be a finite number > 0"),
        ({"patience": 0}, "patience must be an integer >= 1"),
        ({"patience": 2.0}, "patience must be an integer >= 1"),
        ({"max_fraction": 0.0}, r"max_fraction must be in \(0, 1\]"),
        ({"max_fraction": 1.5}, r"max_fraction must be in \(0, 1\]"),
        ({"max_step": 0}, "max_step must be an integer >= 1"),
        ({"tolerance": -0.1}, "tolerance must be a finite number >= 0 or None"),
        ({"tolerance": math.nan}, "tolerance must be a finite number >= 0 or None"),
    ],
)
def test_rejects_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(FreezeError, match=message):
        Converged(4, **options)


def test_registered_as_converged_with_its_defaults() -> None:
    assert POLICIES["converged"] is Converged
    policy = make_policy("converged", 12)
    assert isinstance(policy, Converged) and policy.name == "converged" and policy.needs_stats
    assert (policy.threshold, policy.patience, policy.max_fraction, policy.max_step, policy.tolerance) == (
        0.05,
        3,
        0.75,
        1,
        0.01,
    )
    with pytest.raises(FreezeError, match="signature"):
        make_policy("converged", 12, percentile=50.0)


# --- the held-out guard -----------------------------------------------------------------------------------------


def _ready(num_layers: int = 6, **options: Any) -> Converged:
    """A policy whose every layer has converged (patience 1 after two equal observations)."""
    policy = Converged(num_layers, patience=1, max_fraction=1.0, **options)
    policy.observe(_stats([1.0] * num_layers))
    return policy


def _step(policy: Converged, current: int, loss: float | None) -> int:
    """One interval: quiet statistics, then the held-out loss (if any), then a decision."""
    policy.observe(_stats([1.0] * policy.num_layers))
    if loss is not None:
        policy.observe_eval(loss)
    return decide(policy, 1, 1, current)


def test_guard_stops_freezing_while_the_loss_is_worse_than_the_best() -> None:
    policy, frozen, plan = _ready(), 0, []
    # best 1.0, band up to 1.01: 1.02 holds, a second worse loss and a decision without a loss keep holding,
    # 1.005 is back within the band, 0.9 is a new best, and 0.95 is above 0.9 * 1.01
    for loss in (1.0, 1.02, 1.5, None, 1.005, 0.9, 0.95):
        frozen = _step(policy, frozen, loss)
        plan.append(frozen)
    assert plan == [1, 1, 1, 1, 2, 3, 3]
    state = policy.state_dict()
    assert state["best"] == 0.9 and state["held"] is True


def test_guard_holds_on_a_loss_that_is_not_finite() -> None:
    policy = _ready()
    assert _step(policy, 0, 2.0) == 1
    assert _step(policy, 1, math.nan) == 1
    assert policy.state_dict()["best"] == 2.0  # the non-finite loss is not kept
    assert _step(policy, 1, math.inf) == 1
    assert _step(policy, 1, 2.0) == 2


def test_guard_with_zero_tolerance_holds_on_any_rise() -> None:
    policy = _ready(tolerance=0.0)
    assert [_step(policy, f, loss) for f, loss in ((0, 1.0), (1, 1.0000001), (1, 1.0))] == [1, 1, 2]


def test_guard_off_ignores_the_loss() -> None:
    policy = _ready(tolerance=None)
    assert [_step(policy, f, loss) for f, loss in ((0, 1.0), (1, 100.0), (2, math.nan))] == [1, 2, 3]
    assert policy.state_dict()["best"] is None


# --- snapshots --------------------------------------------------------------------------------------------------


def test_snapshot_is_plain_json_and_restores_exactly() -> None:
    policy = _ready(4)
    _step(policy, 0, 1.0)
    policy.observe(_stats([1.0, 1.0, 3.0, 1.0]))
    policy.observe_eval(1.5)
    state = policy.state_dict()
    assert state == {
        "policy": "converged",
        "num_layers": 4,
        "threshold": 0.05,
        "patience": 1,
        "max_fraction": 1.0,
        "max_step": 1,
        "tolerance": 0.01,
        "prev": [1.0, 1.0, 3.0, 1.0],
        "streaks": [2, 2, 0, 2],
        "fresh": True,
        "best": 1.0,
        "held": True,
    }
    resumed = Converged(4, patience=1, max_fraction=1.0)
    resumed.load_state_dict(json.loads(json.dumps(state, allow_nan=False)))
    assert resumed.state_dict() == state


def test_snapshot_of_another_configuration_is_refused() -> None:
    with pytest.raises(FreezeError, match="patience=3 in the snapshot, expected 2"):
        Converged(4, patience=2).load_state_dict(Converged(4).state_dict())
    with pytest.raises(FreezeError, match=r"tolerance=0\.01 in the snapshot, expected None"):
        Converged(4, tolerance=None).load_state_dict(Converged(4).state_dict())
    with pytest.raises(FreezeError, match="policy='autofreeze'"):
        Converged(4).load_state_dict(AutoFreeze(4).state_dict())
    state = Converged(4).state_dict()
    state["streaks"] = [0, 0]
    with pytest.raises(FreezeError, match="2 streaks in the snapshot, expected 4"):
        Converged(4).load_state_dict(state)


# --- properties -------------------------------------------------------------------------------------------------

L = 6
#: How a layer's norm moves from one observation to the next: mostly not at all (so that quiet streaks happen and
#: layers do freeze), else by a change rate of 2% (below some thresholds), 4%, 100%, to 0, or from 0 back to 1.
_MOVES = {"same": 1.0, "small": 1.02, "mid": 1.04, "big": 2.0, "zero": 0.0}
_move = st.sampled_from(["same"] * 12 + ["small", "mid", "big", "zero"])
#: How the held-out loss moves between evaluations: mostly down or flat, sometimes up (by less and by more than
#: the tolerances), sometimes not finite.
_loss_move = st.sampled_from([0.9, 0.95, 1.0, 1.0, 1.005, 1.05, 1.3, math.nan])
#: An action: ("stats", norms), ("eval", loss) or ("decide", None).
_Action = tuple[str, Any]


@st.composite
def _actions(draw: st.DrawFn) -> list[_Action]:
    """Intervals as a runtime drives them (statistics, maybe a held-out loss, a decision), with some statistics
    or decisions missing or repeated; norms and losses persist from one interval to the next."""
    norms, loss, out = [1.0] * L, 1.0, []
    for _ in range(draw(st.integers(1, 25))):
        if draw(st.sampled_from([True] * 5 + [False])):
            moves = draw(st.lists(_move, min_size=L, max_size=L))
            norms = [1.0 if n == 0 else n * _MOVES[m] for n, m in zip(norms, moves, strict=True)]
            out.append(("stats", list(norms)))
        if draw(st.booleans()):
            move = draw(_loss_move)
            out.append(("eval", math.nan if math.isnan(move) else loss * move))
            loss = loss if math.isnan(move) else loss * move
        out.append(("decide", None))
        if draw(st.sampled_from([False] * 5 + [True])):
            out.append(("decide", None))
    return out


_options = st.fixed_dictionaries(
    {
        "threshold": st.sampled_from([0.01, 0.03, 0.05, 0.6]),
        "patience": st.integers(1, 3),
        "max_fraction": st.floats(0.1, 1.0),
        "max_step": st.integers(1, 3),
        "tolerance": st.sampled_from([None, 0.0, 0.01, 0.1]),
    }
)


def _rate(prev: float, cur: float) -> float:
    if prev > 0:
        return abs(prev - cur) / prev
    return 0.0 if cur == 0 else math.inf


def _drive(policy: Converged, actions: list[_Action], current: int) -> tuple[list[int], int]:
    out = []
    for kind, value in actions:
        if kind == "stats":
            policy.observe(_stats(value))
        elif kind == "eval":
            policy.observe_eval(value)
        else:
            current = decide(policy, 1, 1, current)
            out.append(current)
    return out, current


@FAST
@given(actions=_actions(), options=_options)
def test_only_converged_layers_of_a_prefix_freeze_and_never_past_the_cap(
    actions: list[_Action], options: dict[str, Any]
) -> None:
    policy = Converged(L, **options)
    cap = max_frozen(L, options["max_fraction"])
    history: list[list[float]] = []  # observed norms, the reference's own record
    losses: list[float] = []
    fresh, frozen = False, 0
    for kind, value in actions:
        if kind == "stats":
            policy.observe(_stats(value))
            history.append(value)
            fresh = True
        elif kind == "eval":
            policy.observe_eval(value)
            losses.append(value)
        else:
            new = decide(policy, 1, 1, frozen)
            assert frozen <= new <= max(frozen, cap)
            assert new - frozen <= options["max_step"]
            if new > frozen:
                assert fresh  # a decision needs statistics since the previous one
                tol = options["tolerance"]
                if tol is not None and losses:
                    finite = [x for x in losses if math.isfinite(x)]
                    assert finite and math.isfinite(losses[-1])
                    best = min(finite)
                    assert losses[-1] <= best + tol * abs(best)  # the guard did not hold
            patience, threshold = options["patience"], options["threshold"]
            for layer in range(frozen, new):
                # each newly frozen layer's last `patience` change rates are all below the threshold
                assert len(history) > patience
                recent = [_rate(a[layer], b[layer]) for a, b in itertools.pairwise(history[-patience - 1 :])]
                assert all(r < threshold for r in recent), (layer, recent)
            frozen, fresh = new, False


@FAST
@given(actions=_actions(), options=_options, data=st.data())
def test_resumes_from_a_json_snapshot_with_the_same_future_proposals(
    actions: list[_Action], options: dict[str, Any], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(actions)))
    expected, _ = _drive(Converged(L, **options), actions, 0)
    first = Converged(L, **options)
    head, current = _drive(first, actions[:cut], 0)
    snapshot = json.loads(json.dumps(first.state_dict(), allow_nan=False))  # strict JSON: no NaN or Infinity
    resumed = Converged(L, **options)
    resumed.load_state_dict(snapshot)
    assert resumed.state_dict() == first.state_dict()
    tail, _ = _drive(resumed, actions[cut:], current)
    assert head + tail == expected


@FAST
@given(patience=st.integers(1, 4), max_step=st.integers(1, 3), max_fraction=st.floats(0.1, 1.0))
def test_constant_gradients_freeze_max_step_per_decision_up_to_the_cap(
    patience: int, max_step: int, max_fraction: float
) -> None:
    policy = Converged(L, patience=patience, max_step=max_step, max_fraction=max_fraction)
    plan = _run(policy, [[1.0] * L] * (patience + 1 + L))
    cap = max_frozen(L, max_fraction)
    # the first `patience` decisions lack the evidence; after that, max_step layers per decision up to the cap
    assert plan == [min(cap, max(0, i - patience + 1) * max_step) for i in range(len(plan))]


def test_a_snapshot_written_before_the_shared_guard_still_loads() -> None:
    # the keys and values a Converged snapshot had when the policy kept its own guard (_best, _held)
    old = {
        "policy": "converged",
        "num_layers": 3,
        "threshold": 0.05,
        "patience": 1,
        "max_fraction": 1.0,
        "max_step": 1,
        "tolerance": 0.01,
        "prev": [1.0, 2.0, 4.0],
        "streaks": [1, 1, 0],
        "fresh": True,
        "best": 0.5,
        "held": True,
    }
    policy = Converged(3, patience=1, max_fraction=1.0)
    policy.load_state_dict(old)
    assert isinstance(policy.guard, HeldOutGuard) and (policy.guard.best, policy.guard.held) == (0.5, True)
    assert policy.state_dict() == old  # the same keys come out again
    assert policy.propose(1, 1, 0) == 0  # the guard holds: 0.9 was worse than 0.5
    policy.observe(LayerStats((1.0,) * 3, (1.0, 2.0, 4.0), 1))
    policy.observe_eval(0.501)
    assert policy.propose(2, 2, 0) == 1  # back within 1% of the best: one layer per decision
    assert policy.signal_layers == 3 and Converged(4).signal_layers == 3  # floor(0.75 * 4)
