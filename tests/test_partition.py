"""Partition solvers: exact outputs of uniform/greedy/optimal, hypothesis properties, errors."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.partition import (
    SOLVERS,
    Partition,
    PartitionError,
    optimal_bottleneck,
    price_frozen,
    register_solver,
    solve,
)
from elastic_pipe.types import ElasticPipeError

PROPERTY = settings(max_examples=60, deadline=None)


def brute_force_bottleneck(costs: list[float], stages: int) -> float:
    """The min-max over every placement of the K-1 cuts (the definition, no cleverness)."""
    n = len(costs)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def assert_contiguous_cover(partition: Partition, costs: list[float], stages: int) -> None:
    assert partition.num_stages == stages
    assert all(count >= 1 for count in partition.layers_per_stage)
    assert sum(partition.layers_per_stage) == len(costs)
    bounds = partition.boundaries
    assert bounds[0] == 0 and bounds[-1] == len(costs)
    for stage, (a, b) in enumerate(itertools.pairwise(bounds)):
        assert partition.stage_costs[stage] == pytest.approx(sum(costs[a:b]), rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------------- exact outputs


def test_partition_properties() -> None:
    p = Partition(layers_per_stage=(3, 2, 1), stage_costs=(6.0, 9.0, 6.0), solver="optimal", solve_seconds=0.0)
    assert p.boundaries == (0, 3, 5, 6)
    assert p.bottleneck == 9.0
    assert [p.stage_of(i) for i in range(6)] == [0, 0, 0, 1, 1, 2]
    assert p.to_dict()["layers_per_stage"] == [3, 2, 1]
    with pytest.raises(PartitionError, match="outside"):
        p.stage_of(6)


@pytest.mark.parametrize(
    ("n", "stages", "expected"),
    [(10, 4, (3, 2, 3, 2)), (9, 4, (3, 2, 2, 2)), (11, 4, (3, 2, 3, 3)), (8, 4, (2, 2, 2, 2)), (5, 5, (1,) * 5)],
)
def test_uniform_spreads_the_remainder(n: int, stages: int, expected: tuple[int, ...]) -> None:
    p = solve([1.0] * n, stages, "uniform")
    assert p.layers_per_stage == expected
    assert p.layers_per_stage[-1] <= p.layers_per_stage[0]


def test_optimal_hand_computed() -> None:
    # [1,2,3 | 4,5 | 6]: 9 is optimal (every split with the 4 and the 5 apart puts 10+ somewhere).
    p = solve([1, 2, 3, 4, 5, 6], 3, "optimal")
    assert p.layers_per_stage == (3, 2, 1)
    assert p.stage_costs == (6.0, 9.0, 6.0)
    assert p.solver == "optimal" and p.solve_seconds >= 0


@pytest.mark.parametrize(
    ("costs", "stages", "expected"),
    [
        # near ties: the optimum sits within 1% of a probe's overflow, so any slack in the bracket update shows
        ([42, 16, 45, 15, 6, 36, 49, 19, 33], 3, 102.0),
        ([37, 43, 38, 29, 50, 41, 35], 3, 117.0),
    ],
)
def test_optimal_near_ties(costs: list[float], stages: int, expected: float) -> None:
    assert brute_force_bottleneck([float(c) for c in costs], stages) == expected
    assert solve(costs, stages, "optimal").bottleneck == expected


def test_optimal_fill_back_mirrors_front() -> None:
    assert solve([1, 1, 1, 1, 1, 1], 4, "optimal").layers_per_stage == (2, 2, 1, 1)
    assert solve([1, 1, 1, 1, 1, 1], 4, "optimal", fill="back").layers_per_stage == (1, 1, 2, 2)
    with pytest.raises(PartitionError, match="unknown fill 'middle'; valid: front, back"):
        solve([1, 1], 1, "optimal", fill="middle")


def test_optimal_never_leaves_a_stage_empty_with_zero_costs() -> None:
    p = solve([0, 0, 0, 5, 0, 0], 4, "optimal")
    assert p.bottleneck == 5.0
    assert min(p.layers_per_stage) == 1 and sum(p.layers_per_stage) == 6


def test_greedy_strict_inequality_quirk() -> None:
    # mean 2, variance 0: the second 1 would reach 2, which is not < 2, so device 0 stops at one layer.
    p = solve([1, 1, 1, 1], 2, "greedy", unit=1)
    assert p.layers_per_stage == (1, 3)
    assert p.stage_costs == (1.0, 3.0)


def test_greedy_hand_computed_with_variance_term() -> None:
    # device 0: mean 18/3 = 6, var([2,4,2,4,2,4]) / 3 = 1/3: takes 2, 4 (6 < 6.33), stops before 8.
    # device 1: mean 12/2 = 6, var([2,4,2,4]) / 2 = 0.5: takes 2, 4. device 2 (last) takes the rest.
    p = solve([2e6, 4e6, 2e6, 4e6, 2e6, 4e6], 3, "greedy")
    assert p.layers_per_stage == (2, 2, 2)
    assert p.stage_costs == (6e6, 6e6, 6e6)


def test_greedy_variance_is_population_variance_over_devices_left() -> None:
    # device 0: mean 19/3 = 6.333, var([2,5,1,3,3,5]) = 2.139, / 3 = 0.713 -> takes 2, 5 (7 < 7.046), not 1.
    # device 1: mean 12/2 = 6, var([1,3,3,5]) = 2, / 2 = 1 -> takes 1, 3 (4 < 7), not 3 (7 is not < 7).
    # (a sample variance gives (2, 3, 1), an undivided one (3, 2, 1), no variance term (1, 2, 3))
    p = solve([2e6, 5e6, 1e6, 3e6, 3e6, 5e6], 3, "greedy")
    assert p.layers_per_stage == (2, 2, 2)
    assert p.stage_costs == (7e6, 4e6, 8e6)


def test_greedy_frozen_prefix_goes_to_device_zero_priced_by_factor() -> None:
    sizes = [2, 2, 1, 1, 1, 1, 1, 1]
    # F = 4; factor 1/2 discounts 2: criterion (4-2)+1 = 3 is not < mean 3 + var 0 -> device 0 keeps the frozen 2.
    half = solve(sizes, 2, "greedy", frozen=2, frozen_factor=0.5, unit=1)
    assert half.layers_per_stage == (2, 6)
    assert half.stage_costs == (4.0, 6.0)  # published output: device 0's raw size, frozen included
    # factor 1/4 discounts 3: (4-3)+1 = 2 < 3 takes one more layer, then (5-3)+1 = 3 stops.
    quarter = solve(sizes, 2, "greedy", frozen=2, frozen_factor=0.25, unit=1)
    assert quarter.layers_per_stage == (3, 5)


def test_greedy_unit_matters_raw_counts_pile_onto_device_zero() -> None:
    sizes = [2e6, 4e6, 2e6, 4e6, 2e6, 4e6]
    with pytest.raises(PartitionError, match=r"left stage 1 empty.*unit=1"):
        solve(sizes, 3, "greedy", unit=1)
    verbatim = solve(sizes, 3, "greedy", unit=1, allow_empty=True)
    assert verbatim.layers_per_stage == (6, 0, 0)
    assert verbatim.stage_costs == (18e6, 0.0, 0.0)


def test_frozen_pricing_for_other_solvers() -> None:
    assert price_frozen([6, 6, 6], 2, 0.5) == [3.0, 3.0, 6.0]
    p = solve([6, 6, 6, 6], 2, "optimal", frozen=2, frozen_factor=0.5)
    # priced [3, 3, 6, 6]: best is [3, 3, 6 | 6] = 12 | 6 vs [3, 3 | 6, 6] = 6 | 12 -> 12; [3,3,6|6] also 12.
    assert p.bottleneck == 12.0
    assert sum(p.stage_costs) == 18.0


def test_graph_solver_in_the_registry_prices_activations() -> None:
    # three unit layers; the first emits 100 bytes, the second 1: at 10 bytes/s cut after the second layer.
    p = solve([1.0, 1.0, 1.0], 2, "graph", activation_bytes=[100, 1, 1], bandwidth=10.0)
    assert p.layers_per_stage == (2, 1)
    assert p.stage_costs == pytest.approx((2.1, 1.1))
    assert solve([1.0, 1.0, 1.0], 2, "graph").bottleneck == 2.0  # free transfers: the chain optimum


def test_register_solver_and_unknown_name() -> None:
    def last_heavy(costs: object, stages: int, /, **options: object) -> tuple[int, ...]:
        n = len(costs)  # type: ignore[arg-type]
        return (*([1] * (stages - 1)), n - stages + 1)

    register_solver("test-last-heavy", last_heavy)
    try:
        assert solve([1, 1, 1, 1], 2, "test-last-heavy").layers_per_stage == (1, 3)
    finally:
        del SOLVERS["test-last-heavy"]
    with pytest.raises(PartitionError, match=r"unknown solver 'nope'; valid solvers: graph, greedy, optimal, uniform"):
        solve([1, 2], 1, "nope")


@pytest.mark.parametrize(
    ("costs", "stages", "message"),
    [
        ([1, -1], 1, r"costs\[1\] must be a finite number >= 0, got -1"),
        ([1, float("nan")], 1, r"costs\[1\] must be a finite number >= 0, got nan"),
        ([float("inf")], 1, r"costs\[0\] must be a finite number >= 0, got inf"),
        ([1, 2], 0, "stages must be >= 1, got 0"),
        ([1, 2], 3, r"cannot cut 2 layers into 3 non-empty stages"),
        ([], 1, "costs is empty"),
        ([1, True], 1, r"costs\[1\] must be a number"),
    ],
)
def test_bad_input_is_a_clear_error(costs: list[float], stages: int, message: str) -> None:
    for solver in SOLVERS:
        with pytest.raises(PartitionError, match=message) as info:
            solve(costs, stages, solver)
        assert isinstance(info.value, ValueError) and isinstance(info.value, ElasticPipeError)


def test_bad_frozen_options() -> None:
    with pytest.raises(PartitionError, match=r"frozen must be an int in 0\.\.2"):
        solve([1, 2], 1, "optimal", frozen=3)
    with pytest.raises(PartitionError, match=r"frozen_factor must be in \[0, 1\]"):
        solve([1, 2], 1, "greedy", frozen=1, frozen_factor=2.0)
    with pytest.raises(PartitionError, match="unit must be a finite number > 0"):
        solve([1, 2], 1, "greedy", unit=0)


# ---------------------------------------------------------------------------------------------- properties

small_ints = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=9)
small_floats = st.lists(
    st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False), min_size=1, max_size=9
)


@PROPERTY
@given(costs=small_ints, data=st.data())
def test_optimal_equals_brute_force_on_integers(costs: list[int], data: st.DataObject) -> None:
    stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    values = [float(c) for c in costs]
    p = solve(values, stages, "optimal")
    assert_contiguous_cover(p, values, stages)
    assert p.bottleneck == brute_force_bottleneck(values, stages)
    assert optimal_bottleneck(values, stages) == p.bottleneck


@PROPERTY
@given(costs=small_floats, data=st.data())
def test_optimal_equals_brute_force_on_floats(costs: list[float], data: st.DataObject) -> None:
    stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    p = solve(costs, stages, "optimal")
    assert_contiguous_cover(p, costs, stages)
    assert p.bottleneck == pytest.approx(brute_force_bottleneck(costs, stages), rel=1e-9, abs=1e-9)


@PROPERTY
@given(
    costs=st.lists(st.one_of(st.integers(0, 10**7), st.floats(0, 1e7, allow_nan=False)), min_size=1, max_size=200).map(
        lambda xs: [float(x) for x in xs]
    ),
    data=st.data(),
)
def test_every_solver_covers_contiguously_and_optimal_is_best(costs: list[float], data: st.DataObject) -> None:
    stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    best = solve(costs, stages, "optimal")
    assert_contiguous_cover(best, costs, stages)
    back = solve(costs, stages, "optimal", fill="back")
    assert_contiguous_cover(back, costs, stages)
    assert back.bottleneck == pytest.approx(best.bottleneck, rel=1e-12, abs=1e-9)
    for name in SOLVERS:
        try:
            p = solve(costs, stages, name)
        except PartitionError as exc:  # only the published greedy rule may refuse (an empty stage)
            assert name == "greedy" and "empty" in str(exc)
            continue
        assert_contiguous_cover(p, costs, stages)
        assert best.bottleneck <= p.bottleneck * (1 + 1e-12) + 1e-9
    # Any other cut is no better either.
    if len(costs) > 1:
        cuts = sorted(data.draw(st.sets(st.integers(1, len(costs) - 1), min_size=stages - 1, max_size=stages - 1)))
        bounds = (0, *cuts, len(costs))
        other = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
        assert best.bottleneck <= other * (1 + 1e-12) + 1e-9


@PROPERTY
@given(costs=small_floats, data=st.data())
def test_greedy_assigns_every_layer_in_order(costs: list[float], data: st.DataObject) -> None:
    stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    frozen = data.draw(st.integers(min_value=0, max_value=len(costs)))
    p = solve(costs, stages, "greedy", frozen=frozen, unit=1.0, allow_empty=True)
    assert sum(p.layers_per_stage) == len(costs)
    assert p.layers_per_stage[0] >= frozen
    assert sum(p.stage_costs) == pytest.approx(sum(costs))
