"""Freeze policies: exact published schedules, the paper and AutoFreeze rules, FreezeOut, manual, the registry,
the proposal guard, and resuming from a snapshot."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.freeze import (
    POLICIES,
    AlphaSchedule,
    AutoFreeze,
    FreezeError,
    FreezeOut,
    FreezePolicy,
    LayerStats,
    ManualSchedule,
    Never,
    PaperRule,
    alpha_frozen,
    change_ratios,
    decide,
    frozen_by_epoch,
    make_policy,
    parse_manual,
    register_policy,
)
from elastic_pipe.freeze._numeric import percentile
from elastic_pipe.types import ElasticPipeError

FAST = settings(max_examples=40, deadline=None)


def _stats(l1: list[float], l2: list[float] | None = None, steps: int = 1) -> LayerStats:
    return LayerStats(tuple(l1), tuple(l2 if l2 is not None else l1), steps)


# --- the published alpha schedule -------------------------------------------------------------------------------


def test_alpha_one_third_matches_published_sequence() -> None:
    assert [alpha_frozen(12, 1 / 3, e) for e in range(10)] == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]
    assert frozen_by_epoch(AlphaSchedule(12, 1 / 3), 10) == (0, 4, 7, 9, 10, 11, 11, 12, 12, 12)


def test_alpha_one_half_matches_published_sequence() -> None:
    assert frozen_by_epoch(AlphaSchedule(12, 0.5), 5) == (0, 6, 9, 11, 12)


def test_alpha_ceiling_ignores_float_noise() -> None:
    # 9 * (1 - (8/9)) is exactly 1, but evaluates to 1.0000000000000004: a plain ceil would say 2
    raw = 9 * (1.0 - (1.0 - 1 / 9) ** 1)
    assert raw > 1 and math.ceil(raw) == 2
    assert alpha_frozen(9, 1 / 9, 1) == 1
    raw = 35 * (1.0 - (1.0 - 3 / 7) ** 1)
    assert math.ceil(raw) == 16 and alpha_frozen(35, 3 / 7, 1) == 15


@FAST
@given(
    q=st.integers(2, 10),
    data=st.data(),
    num_layers=st.integers(1, 60),
    epoch=st.integers(0, 6),
)
def test_alpha_equals_exact_rational_ceiling(q: int, data: st.DataObject, num_layers: int, epoch: int) -> None:
    # with q <= 10 and epoch <= 6 an exact value is either an integer or >= 1e-6 away from one, so the tolerant
    # ceiling must agree with exact rational arithmetic
    p = data.draw(st.integers(1, q - 1))
    exact = num_layers * (1 - (1 - Fraction(p, q)) ** epoch)
    assert alpha_frozen(num_layers, p / q, epoch) == math.ceil(exact)


@FAST
@given(num_layers=st.integers(1, 200), alpha=st.floats(1e-3, 1.0), epochs=st.integers(1, 40))
def test_alpha_schedule_is_monotone_and_bounded(num_layers: int, alpha: float, epochs: int) -> None:
    plan = frozen_by_epoch(AlphaSchedule(num_layers, alpha), epochs)
    assert plan[0] == 0
    assert all(0 <= a <= b <= num_layers for a, b in itertools.pairwise(plan))


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, math.nan])
def test_alpha_rejects_bad_alpha(alpha: float) -> None:
    with pytest.raises(FreezeError, match="alpha must be in"):
        AlphaSchedule(12, alpha)


def test_alpha_keeps_more_frozen_layers_than_it_would_freeze() -> None:
    assert AlphaSchedule(12, 1 / 3).propose(epoch=1, step=0, current=8) == 8


# --- the paper rule ---------------------------------------------------------------------------------------------


def test_paper_rule_without_binding_cap_is_the_alpha_schedule() -> None:
    policy = PaperRule(12, 1 / 3)
    decreasing = [float(12 - i) for i in range(12)]  # argmin always the last layer: the cap is L
    frozen, plan = 0, []
    for epoch in range(10):
        if epoch:
            policy.observe(_stats(decreasing))
        frozen = decide(policy, epoch, epoch * 5, frozen)
        plan.append(frozen)
    assert plan == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]


def test_paper_rule_is_capped_by_the_gradient_norm_argmin() -> None:
    policy = PaperRule(12, 1 / 3)
    # epoch 1: progressive term 4, but the smallest active norm is layer 2 -> at most 3 frozen
    policy.observe(_stats([9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9], [5, 4, 0.5, 3, 3, 3, 3, 3, 3, 3, 3, 3]))
    assert decide(policy, 1, 10, 0) == 3
    # repeated asks within the epoch give the same answer
    assert decide(policy, 1, 11, 3) == 3
    # epoch 2: progressive term continues from the capped 3: 3 + (12 - 3) / 3 = 6; argmin among active 3..11 is 11
    policy.observe(_stats([1.0] * 12, [0.0, 0.0, 0.0] + [float(12 - i) for i in range(3, 12)]))
    assert decide(policy, 2, 20, 3) == 6


def test_paper_rule_freezes_nothing_new_without_statistics() -> None:
    policy = PaperRule(12, 0.5)
    assert decide(policy, 1, 10, 0) == 0
    assert decide(policy, 2, 20, 2) == 2


def test_paper_rule_rejects_stats_of_the_wrong_size() -> None:
    with pytest.raises(FreezeError, match="expected 12 layers"):
        PaperRule(12, 0.5).observe(LayerStats.zeros(6, steps=1))
    with pytest.raises(FreezeError, match=">= 1 step"):
        PaperRule(12, 0.5).observe(LayerStats.zeros(12, steps=0))


# --- AutoFreeze ------------------------------------------------------------------------------------------------


def test_autofreeze_freezes_through_first_layer_at_the_median_change() -> None:
    policy = AutoFreeze(4)
    policy.observe(_stats([10, 10, 10, 10]))
    assert decide(policy, 0, 100, 0) == 0  # first interval: baseline only
    # ratios 0.1, 0.5, 0.2, 0.8 -> median 0.35 -> first layer at or above it is layer 1 -> freeze 2
    policy.observe(_stats([9, 5, 8, 2]))
    assert decide(policy, 0, 200, 0) == 2
    assert decide(policy, 0, 250, 2) == 2  # no new interval: same answer
    # active layers 2, 3: ratios 0.5, 0.05 -> median 0.275 -> layer 2 -> freeze 3
    policy.observe(_stats([0, 0, 4, 1.9]))
    assert decide(policy, 0, 300, 2) == 3


def test_autofreeze_compares_mean_gradients_over_unequal_intervals() -> None:
    policy = AutoFreeze(3, percentile=100.0)
    policy.observe(_stats([10, 10, 10], steps=1))
    decide(policy, 0, 1, 0)
    # 3 steps summing to 30, 30, 15: means 10, 10, 5 -> ratios 0, 0, 0.5 -> p100 = 0.5 -> layer 2 -> freeze 3
    policy.observe(_stats([30, 30, 15], steps=3))
    assert decide(policy, 0, 4, 0) == 3


def test_change_ratios_handle_zero_previous_norms() -> None:
    assert change_ratios((2.0, 0.0, 0.0), (1.0, 0.0, 3.0)) == (0.5, 0.0, math.inf)


@FAST
@given(values=st.lists(st.floats(0, 1e6), min_size=1, max_size=30), q=st.floats(0, 100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-12)


def test_percentile_with_infinities_is_defined() -> None:
    assert percentile([1.0, math.inf, math.inf], 75.0) == math.inf
    assert percentile([0.0, 1.0, math.inf], 25.0) == 0.5


# --- FreezeOut, manual, never -----------------------------------------------------------------------------------


def test_freezeout_stop_steps() -> None:
    policy = FreezeOut(4, t0=0.5, total_steps=100)  # layers stop at 50, 62.5, 75, 87.5
    assert [policy.frozen_at(s) for s in (0, 49, 50, 62, 63, 75, 87, 88, 100)] == [0, 0, 1, 1, 2, 3, 3, 4, 4]
    assert policy.lr_scale(0, 25) == pytest.approx(0.5)
    assert policy.lr_scale(0, 0) == 1.0
    assert policy.lr_scale(0, 50) == 0.0


def test_freezeout_cubic_freezes_early_layers_sooner() -> None:
    policy = FreezeOut(4, t0=0.5, total_steps=1000, cubic=True)  # 0.5^3, 0.625^3, 0.75^3, 0.875^3
    assert [policy.stop_step(i) for i in range(4)] == pytest.approx([125.0, 244.140625, 421.875, 669.921875])
    assert [policy.frozen_at(s) for s in (124, 125, 245, 500, 700)] == [0, 1, 2, 3, 4]


def test_freezeout_deadline_ignores_float_noise() -> None:
    policy = FreezeOut(9, t0=0.1, total_steps=10)  # layer 2 stops at 3.0000000000000004 in floats, 3 exactly
    assert policy.stop_step(2) > 3
    assert policy.frozen_at(3) == 3


def test_manual_schedule_holds_between_entries() -> None:
    policy = ManualSchedule(12, {2: 4, 5: 8})
    assert frozen_by_epoch(policy, 7) == (0, 0, 4, 4, 4, 8, 8)


def test_manual_schedule_reads_epochs_written_as_table_keys() -> None:
    # TOML and JSON tables key by string: '{"2": 4}' is epoch 2; other strings are still refused
    assert ManualSchedule(12, {"2": 4, "5": 8}).schedule == ManualSchedule(12, {2: 4, 5: 8}).schedule
    for bad in ("two", "-1", "1.5"):
        with pytest.raises(FreezeError, match="schedule epoch"):
            ManualSchedule(12, {bad: 4})


def test_manual_schedule_rejects_unfreezing_and_bad_counts() -> None:
    with pytest.raises(FreezeError, match="non-decreasing"):
        ManualSchedule(12, {1: 6, 3: 2})
    with pytest.raises(FreezeError, match=r"frozen in \[0, 12\]"):
        ManualSchedule(12, {1: 13})


def test_parse_manual() -> None:
    assert parse_manual("2:4, 5:8") == {2: 4, 5: 8}
    with pytest.raises(FreezeError, match="EPOCH:FROZEN"):
        parse_manual("2-4")
    with pytest.raises(FreezeError, match="twice"):
        parse_manual("2:4,2:5")


def test_never_keeps_the_current_count() -> None:
    assert frozen_by_epoch(Never(12), 4) == (0, 0, 0, 0)
    assert Never(12).propose(3, 0, 5) == 5


# --- protocol, guard, registry ----------------------------------------------------------------------------------


class _Unfreezer:
    """A custom policy with every protocol member, answering a fixed count."""

    name = "unfreezer"
    needs_stats = False
    num_layers = 4

    def __init__(self, answer: int) -> None:
        self.answer = answer

    def observe(self, stats: LayerStats) -> None:
        pass

    def observe_eval(self, loss: float) -> None:
        pass

    def propose(self, epoch: int, step: int, current: int) -> int:
        return self.answer

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _OldProtocol:
    """A policy written against the protocol before ``name``, ``needs_stats`` and ``observe_eval``."""

    num_layers = 4
    can_unfreeze = True

    def observe(self, stats: LayerStats) -> None:
        pass

    def propose(self, epoch: int, step: int, current: int) -> int:
        return current

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_decide_rejects_bad_proposals() -> None:
    assert isinstance(_Unfreezer(0), FreezePolicy)
    with pytest.raises(FreezeError, match=r"'unfreezer'.*returned 5, expected a count in \[0, 4\]"):
        decide(_Unfreezer(5), 0, 0, 0)
    with pytest.raises(FreezeError, match="current frozen count"):
        decide(_Unfreezer(1), 0, 0, 7)
    with pytest.raises(FreezeError, match="expected an int"):
        decide(_Unfreezer(True), 0, 0, 0)


def test_decide_refuses_a_decrease_naming_the_policy() -> None:
    # there is no can_unfreeze switch any more: a policy that declares it still may not thaw
    unfreezer = _Unfreezer(1)
    unfreezer.can_unfreeze = True  # type: ignore[attr-defined]
    with pytest.raises(FreezeError, match=r"freeze policy 'unfreezer' \(_Unfreezer\).*1 < current 3.*thawing"):
        decide(unfreezer, 0, 0, 3)
    assert decide(_Unfreezer(3), 0, 0, 3) == 3


@pytest.mark.parametrize("member", ["name", "needs_stats", "observe_eval"])
def test_a_policy_missing_a_member_is_not_a_freeze_policy(member: str) -> None:
    namespace = {k: v for k, v in vars(_Unfreezer).items() if k != member and not k.startswith("__")}
    partial = type("Partial", (), {**namespace, "__init__": _Unfreezer.__init__})(0)
    assert not isinstance(partial, FreezePolicy)
    with pytest.raises(FreezeError, match=rf"lacks the FreezePolicy members \['{member}'\]"):
        decide(partial, 0, 0, 0)


def test_the_old_protocol_is_refused_by_name() -> None:
    old = _OldProtocol()
    assert not isinstance(old, FreezePolicy)
    with pytest.raises(FreezeError, match=r"\['name', 'needs_stats', 'observe_eval'\]"):
        decide(old, 0, 0, 0)  # type: ignore[arg-type]
    # a registered factory of such a policy builds it completed with the defaults (issue 45: the earlier protocol
    # keeps working); decide() itself still checks the whole protocol
    register_policy("test-old", lambda num_layers: _OldProtocol())
    try:
        built = make_policy("test-old", 4)
        assert isinstance(built, FreezePolicy) and built.name == "_OldProtocol" and not built.needs_stats
        assert decide(built, 0, 0, 2) == 2
    finally:
        del POLICIES["test-old"]
    register_policy("test-none", lambda num_layers: object())
    try:
        with pytest.raises(FreezeError, match=r"freeze policy 'test-none'.*lacks \['num_layers', 'propose'\]"):
            make_policy("test-none", 4)
    finally:
        del POLICIES["test-none"]


def test_every_builtin_declares_name_and_needs_stats_on_the_class() -> None:
    expected_stats = {
        "alpha": False,
        "paper": True,
        "autofreeze": True,
        "converged": True,
        "settled": True,
        "drift": False,
        "freezeout": False,
        "manual": False,
        "never": False,
    }
    assert set(POLICIES) == set(expected_stats)
    for name, factory in POLICIES.items():
        assert isinstance(factory, type)
        assert vars(factory)["name"] == name
        assert vars(factory)["needs_stats"] is expected_stats[name]
        assert "observe_eval" in vars(factory) and "can_unfreeze" not in vars(factory)


def test_make_policy_builds_every_builtin() -> None:
    options: dict[str, dict[str, Any]] = {
        "alpha": {"alpha": 0.25},
        "paper": {"alpha": 0.25},
        "autofreeze": {},
        "converged": {},
        "settled": {},
        "drift": {"total_steps": 10},
        "freezeout": {"t0": 0.5, "total_steps": 10},
        "manual": {"schedule": {1: 2}},
        "never": {},
    }
    assert set(options) == set(POLICIES)
    for name, kw in options.items():
        policy = make_policy(name, 8, **kw)
        assert isinstance(policy, FreezePolicy) and policy.num_layers == 8 and policy.name == name
        policy.observe_eval(0.5)  # every built-in takes the held-out loss (all but one ignore it)


def test_make_policy_errors_name_the_valid_choices() -> None:
    with pytest.raises(FreezeError, match=r"unknown freeze policy 'nope'; expected one of \[.*'alpha'"):
        make_policy("nope", 12)
    with pytest.raises(FreezeError, match=r"'alpha'.*signature"):
        make_policy("alpha", 12, percentile=3)
    with pytest.raises(ElasticPipeError):
        make_policy("alpha", 0, alpha=0.5)


def test_register_policy_plugs_in_a_custom_policy() -> None:
    register_policy("test-unfreezer", lambda num_layers, answer=0: _Unfreezer(answer))
    try:
        assert make_policy("test-unfreezer", 4, answer=2).propose(0, 0, 0) == 2
        with pytest.raises(FreezeError, match="already registered"):
            register_policy("test-unfreezer", _Unfreezer)
    finally:
        del POLICIES["test-unfreezer"]


def test_frozen_by_epoch_refuses_statistics_driven_policies() -> None:
    with pytest.raises(FreezeError, match="gradient statistics"):
        frozen_by_epoch(PaperRule(12, 0.5), 3)


# --- resume -----------------------------------------------------------------------------------------------------

_norms = st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=6, max_size=6)
#: An action is either an observation (l1, l2, steps) or None: a decision at the next epoch.
_Action = tuple[list[float], list[float], int] | None
_actions = st.lists(st.one_of(st.none(), st.tuples(_norms, _norms, st.integers(1, 5))), min_size=2, max_size=20)


def _drive(policy: FreezePolicy, actions: list[_Action], epoch: int, current: int) -> tuple[list[int], int, int]:
    """Replay actions; return the decisions and the (epoch, current) reached."""
    out = []
    for action in actions:
        if action is None:
            epoch += 1
            current = decide(policy, epoch, epoch * 10, current)
            out.append(current)
        else:
            l1, l2, steps = action
            policy.observe(LayerStats(tuple(l1), tuple(l2), steps))
    return out, epoch, current


@FAST
@given(actions=_actions, data=st.data(), which=st.sampled_from(["paper", "autofreeze", "alpha"]))
def test_policies_resume_from_a_json_snapshot(actions: list[_Action], data: st.DataObject, which: str) -> None:
    options = {"paper": {"alpha": 0.3}, "autofreeze": {"percentile": 40.0}, "alpha": {"alpha": 0.3}}[which]
    cut = data.draw(st.integers(1, len(actions) - 1))  # anywhere, also between an observation and its decision
    expected, _, _ = _drive(make_policy(which, 6, **options), actions, 0, 0)

    first = make_policy(which, 6, **options)
    head, epoch, current = _drive(first, actions[:cut], 0, 0)
    snapshot = json.loads(json.dumps(first.state_dict()))
    resumed = make_policy(which, 6, **options)
    resumed.load_state_dict(snapshot)
    tail, _, _ = _drive(resumed, actions[cut:], epoch, current)
    assert head + tail == expected


def test_snapshot_of_another_policy_is_refused() -> None:
    with pytest.raises(FreezeError, match=r"alpha=0\.5 in the snapshot, expected 0\.25"):
        PaperRule(12, 0.25).load_state_dict(PaperRule(12, 0.5).state_dict())
    with pytest.raises(FreezeError, match="policy='alpha'"):
        AutoFreeze(12).load_state_dict(AlphaSchedule(12, 0.5).state_dict())


# --- invariants of the statistics-driven rules ------------------------------------------------------------------


@FAST
@given(rounds=st.lists(st.tuples(_norms, _norms), min_size=1, max_size=12), alpha=st.floats(0.05, 1.0))
def test_paper_rule_never_runs_ahead_of_the_alpha_schedule(
    rounds: list[tuple[list[float], list[float]]], alpha: float
) -> None:
    policy, frozen = PaperRule(6, alpha), 0
    for epoch, (l1, l2) in enumerate(rounds, start=1):
        policy.observe(LayerStats(tuple(l1), tuple(l2), 1))
        new = decide(policy, epoch, epoch, frozen)
        assert frozen <= new <= alpha_frozen(6, alpha, epoch)
        frozen = new


@FAST
@given(rounds=st.lists(_norms, min_size=2, max_size=12), q=st.floats(0.0, 100.0))
def test_autofreeze_advances_by_at_least_one_layer_per_decision(rounds: list[list[float]], q: float) -> None:
    policy, frozen = AutoFreeze(6, percentile=q), 0
    for index, l1 in enumerate(rounds):
        policy.observe(LayerStats(tuple(l1), tuple(l1), 1))
        new = decide(policy, 0, index, frozen)
        # the threshold lies within the active ratios, so some active layer reaches it once a baseline exists
        assert new == frozen if index == 0 or frozen == 6 else frozen < new <= 6
        frozen = new
