"""Pipeline compression (published halving rule, memory rule) and the cost models."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.models.catalogue import model_shape
from elastic_pipe.partition import (
    Compression,
    PartitionError,
    TrainingPrecision,
    compress_halving,
    compress_memory,
    divisors,
    initial_budget,
    parse_bytes,
    solve,
    transformer_costs,
    weights_from_costs,
)
from elastic_pipe.types import ByteSizeError, LayerCost


@pytest.mark.parametrize(
    ("budget", "pipe_len", "tried"),
    [
        (1.0, 8, [(4, 2.0)]),
        (2.0, 4, [(4, 2.0), (2, 4.0)]),
        (4.0, 2, [(4, 2.0), (2, 4.0), (1, 8.0)]),
        (8.0, 1, [(4, 2.0), (2, 4.0), (1, 8.0)]),
    ],
)
def test_halving_hand_computed(budget: float, pipe_len: int, tried: list[tuple[int, float]]) -> None:
    result = compress_halving([1.0] * 8, 8, budget, solver="optimal")
    assert result.pipe_len == pipe_len
    assert list(result.tried) == tried
    assert result.partition.layers_per_stage == (8 // pipe_len,) * pipe_len
    assert result.rule == "halving"


def test_halving_with_the_published_greedy_rule() -> None:
    model = [2e6, 4e6] * 4
    # M0: greedy on 4 devices, nothing frozen, gives (2, 2, 2, 2) with 6e6 each.
    assert initial_budget(model, 4) == 6e6
    # Two blocks (4 entries) freeze and leave; greedy on the 4 active entries over 2 devices: mean 6,
    # var([2,4,2,4]) / 2 = 0.5, so (2, 2) with 6e6 each fits M0; over 1 device 12e6 does not.
    result = compress_halving(model[4:], 4, 6e6)
    assert result.pipe_len == 2
    assert result.partition.layers_per_stage == (2, 2)
    assert list(result.tried) == [(2, 6e6), (1, 12e6)]


def test_published_greedy_leaves_stages_empty_when_one_entry_overshoots() -> None:
    # device 1: mean 16/5 = 3.2, threshold 3.2 + var([4,2,4,2,4]) / 5 = 3.392 < 4: it takes nothing.
    with pytest.raises(PartitionError, match=r"left stage 1 empty \(layers per stage \[1, 0, 1, 1, 1, 2\]\)"):
        solve([2e6, 4e6] * 3, 6, "greedy")


def test_halving_first_shortens_a_pipeline_longer_than_the_model() -> None:
    result = compress_halving([1.0, 1.0, 1.0], 8, 0.5, solver="optimal")
    assert result.pipe_len == 2  # 8 -> 4 -> 2 without a check (3 layers), then 1 stage (3.0) does not fit
    assert list(result.tried) == [(1, 3.0)]


def test_memory_rule_uses_divisors_not_powers_of_two() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    six = compress_memory([3.0] * 6, 6, 6.0)
    assert six.pipe_len == 3 and list(six.tried) == [(1, 18.0), (2, 9.0), (3, 6.0)]
    four = compress_memory([3.0] * 6, 4, 8.0)
    assert four.pipe_len == 4 and list(four.tried) == [(1, 18.0), (2, 9.0), (4, 6.0)]
    with pytest.raises(PartitionError, match=r"no pipeline length dividing 4 devices fits budget=5"):
        compress_memory([3.0] * 6, 4, 5.0)


@settings(max_examples=40, deadline=None)
@given(
    memory=st.lists(st.integers(0, 100).map(float), min_size=1, max_size=30),
    devices=st.integers(1, 24),
    budget=st.integers(0, 800).map(float),
)
def test_memory_rule_picks_the_smallest_fitting_divisor(memory: list[float], devices: int, budget: float) -> None:
    fitting = [k for k in divisors(devices) if k <= len(memory) and solve(memory, k).bottleneck <= budget]
    if not fitting:
        with pytest.raises(PartitionError):
            compress_memory(memory, devices, budget)
        return
    result = compress_memory(memory, devices, budget)
    assert result.pipe_len == fitting[0]
    assert devices % result.pipe_len == 0
    assert result.partition.bottleneck <= budget


def test_compression_errors() -> None:
    with pytest.raises(PartitionError, match="from_stages must be an int >= 1, got 0"):
        compress_halving([1.0], 0, 1.0)
    with pytest.raises(PartitionError, match="budget must be a number >= 0"):
        compress_memory([1.0], 2, float("nan"))
    with pytest.raises(PartitionError, match=r"sizes\[0\] must be a finite number >= 0"):
        compress_halving([-1.0], 2, 1.0)
    with pytest.raises(PartitionError, match="pipe_len=2 but the partition has 1 stages"):
        Compression(pipe_len=2, partition=solve([1.0], 1))


def test_weights_from_costs_frozen_pricing() -> None:
    costs = [
        LayerCost("a", params=600, forward=1.0, backward=2.0, memory_bytes=60, frozen_forward=0.5),
        LayerCost("b", params=600, forward=1.0, backward=2.0, memory_bytes=60, frozen_memory_bytes=10),
        LayerCost("c", params=600, forward=1.0, backward=2.0, memory_bytes=60),
    ]
    assert weights_from_costs(costs, "time") == [3.0, 3.0, 3.0]
    assert weights_from_costs(costs, "time", frozen=2) == [0.5, 0.5, 3.0]  # a measured, b priced 3 * 1/6
    assert weights_from_costs(costs, "memory", frozen=2) == [10.0, 10.0, 60.0]  # a priced 60/6, b measured
    assert weights_from_costs(costs, "params", frozen=1, frozen_factor=0.5) == [300.0, 600.0, 600.0]
    with pytest.raises(PartitionError, match="unknown metric 'flops'; valid metrics: time, params, memory"):
        weights_from_costs(costs, "flops")


def test_transformer_costs_bert_large() -> None:
    precision = TrainingPrecision()
    costs = transformer_costs(model_shape("bert-large"), 4, flops_per_second=1e12, precision=precision)
    assert [c.name for c in costs[:3]] == ["embed", "block0.attn", "block0.mlp"]
    assert len(costs) == 1 + 2 * 24
    h, s, b = 1024, 512, 4
    attn, mlp = costs[1], costs[2]
    assert attn.params == 4 * h * h + 4 * h + 2 * h
    assert mlp.params == 2 * h * 4096 + 4096 + h + 2 * h
    assert sum(c.params for c in costs[1:]) == 24 * (attn.params + mlp.params)  # ~302M, BERT-large's encoder
    assert attn.forward == pytest.approx(2 * (4 * b * s * h * h + 2 * b * s * s * h) / 1e12)
    assert attn.backward == pytest.approx(2 * attn.forward)
    assert mlp.activation_bytes == b * s * h * 2
    stored_mlp = 21 * b * s * h  # Korthikanti et al.: MLP 19 sbh + its layer norm 2 sbh, 16-bit
    assert mlp.memory_bytes == mlp.params * 16 + stored_mlp
    assert mlp.frozen_memory_bytes == mlp.params * 4


@pytest.mark.parametrize(
    ("text", "value"), [("16GiB", 16 * 2**30), ("1.5e9", 1.5e9), ("512 MB", 512e6), (7, 7.0), ("2kib", 2048.0)]
)
def test_parse_bytes(text: str | float, value: float) -> None:
    assert parse_bytes(text) == value


def test_parse_bytes_rejects_garbage() -> None:
    with pytest.raises(ByteSizeError, match="cannot read '12 parsecs' as a size"):
        parse_bytes("12 parsecs")
