"""A solver carries its own frozen-pricing flag: a solver object and its registered name give the same partition."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe import partition
from elastic_pipe.partition import SOLVERS, PartitionError, register_solver, solve
from elastic_pipe.partition.pricing import PricedSolver, prices_frozen


def _outcome(costs: Sequence[float], stages: int, solver: object, frozen: int) -> object:
    try:
        p = solve(costs, stages, solver, frozen=frozen)  # type: ignore[arg-type]
    except PartitionError as exc:  # greedy may leave a stage empty: then both ways must refuse alike
        return ("refused", str(exc))
    return (p.layers_per_stage, p.stage_costs, p.solver)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    costs=st.lists(st.integers(min_value=0, max_value=50_000_000).map(float), min_size=1, max_size=30),
)
def test_a_solver_object_and_its_name_give_the_same_partition(data: st.DataObject, costs: list[float]) -> None:
    stages = data.draw(st.integers(min_value=1, max_value=len(costs)), label="stages")
    frozen = data.draw(st.integers(min_value=0, max_value=len(costs)), label="frozen")
    for name, solver in SOLVERS.items():
        by_name = _outcome(costs, stages, name, frozen)
        by_object = _outcome(costs, stages, solver, frozen)
        if isinstance(by_name, tuple) and by_name[0] != "refused":
            by_name = by_name[:2]  # the name recorded differs: the registered name vs the function's
            by_object = by_object[:2]  # type: ignore[index]
        assert by_object == by_name, name


def test_greedy_by_object_applies_the_published_frozen_rule() -> None:
    costs = [2e6] * 29
    by_name = solve(costs, 5, "greedy", frozen=14)
    by_object = solve(costs, 5, partition.greedy, frozen=14)
    assert by_name.layers_per_stage == by_object.layers_per_stage == (14, 3, 3, 4, 5)
    assert by_name.stage_costs == by_object.stage_costs
    # what the object gave when the flag was keyed on the name: the frozen costs scaled first, then the rule
    assert solve(costs, 5, PricedSolver(partition.greedy, False), frozen=14).layers_per_stage == (15, 3, 3, 3, 5)
    assert prices_frozen(partition.greedy) and not prices_frozen(partition.optimal)


def test_registering_with_a_flag_marks_the_registered_object_not_the_function() -> None:
    seen: list[dict[str, object]] = []

    def one_each(costs: Sequence[float], stages: int, /, **options: object) -> tuple[int, ...]:
        seen.append(dict(options))
        return (*([1] * (stages - 1)), len(costs) - stages + 1)

    register_solver("test-prices-itself", one_each, prices_frozen_itself=True)
    try:
        registered = SOLVERS["test-prices-itself"]
        assert prices_frozen(registered) and not prices_frozen(one_each)
        by_name = solve([6.0, 6.0, 6.0], 2, "test-prices-itself", frozen=1)
        by_object = solve([6.0, 6.0, 6.0], 2, registered, frozen=1)
        assert by_name.stage_costs == by_object.stage_costs == (6.0, 12.0)  # unscaled: the solver prices them
        assert seen[0]["frozen"] == seen[1]["frozen"] == 1
        # the bare function is unmarked: solve scales its frozen costs (6 * 1/6) and passes no frozen option
        assert solve([6.0, 6.0, 6.0], 2, one_each, frozen=1).stage_costs == pytest.approx((1.0, 12.0))
        assert "frozen" not in seen[2]
        register_solver("test-prices-itself", partition.greedy, prices_frozen_itself=False)
        assert not prices_frozen(SOLVERS["test-prices-itself"]) and prices_frozen(partition.greedy)
        register_solver("test-prices-itself", partition.greedy)  # None keeps the solver's own flag
        assert SOLVERS["test-prices-itself"] is partition.greedy
    finally:
        del SOLVERS["test-prices-itself"]
