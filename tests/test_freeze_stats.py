"""Gradient statistics: LayerStats, the pure merge, the tracker's real accumulation, and a 2-rank gather."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from elastic_pipe.freeze import FreezeError, GradNormTracker, LayerStats, merge_stats
from elastic_pipe.testing import RankContext, run_distributed

FAST = settings(max_examples=30, deadline=None)
NUM_LAYERS = 4


def test_layer_stats_validate() -> None:
    with pytest.raises(FreezeError, match="equal length"):
        LayerStats((1.0,), (1.0, 2.0), 1)
    with pytest.raises(FreezeError, match=r"l2\[1\] must be a finite number"):
        LayerStats((1.0, 1.0), (1.0, math.nan), 1)
    with pytest.raises(FreezeError, match="steps must be an integer >= 0"):
        LayerStats((), (), -1)


def test_means_divide_by_steps() -> None:
    stats = LayerStats((4.0, 2.0), (2.0, 1.0), 2)
    assert stats.mean_l1() == (2.0, 1.0) and stats.mean_l2() == (1.0, 0.5)


_vec = st.lists(st.floats(0, 1e3), min_size=3, max_size=3).map(tuple)


@FAST
@given(l1=_vec, l2=_vec, steps=st.integers(0, 10**6))
def test_tensor_round_trip(l1: tuple[float, ...], l2: tuple[float, ...], steps: int) -> None:
    stats = LayerStats(l1, l2, steps)
    assert LayerStats.from_tensor(stats.to_tensor()) == stats


def test_from_tensor_rejects_bad_shapes() -> None:
    with pytest.raises(FreezeError, match="odd length"):
        LayerStats.from_tensor(torch.zeros(4))
    with pytest.raises(FreezeError, match="whole number"):
        LayerStats.from_tensor(torch.tensor([1.5, 0.0, 0.0]))


def test_merge_of_disjoint_stages_and_of_a_split_layer() -> None:
    stage0 = LayerStats((3.0, 1.0, 0.0), (4.0, 1.0, 0.0), 5)
    stage1 = LayerStats((0.0, 2.0, 7.0), (0.0, 1.0, 5.0), 5)  # layer 1 split over both stages
    merged = merge_stats([stage0, stage1])
    assert merged.l1 == (3.0, 3.0, 7.0)
    assert merged.l2 == pytest.approx((4.0, math.sqrt(2.0), 5.0))
    assert merged.steps == 5
    assert merge_stats([stage0]) == stage0


def test_merge_rejects_disagreeing_pieces() -> None:
    with pytest.raises(FreezeError, match="at least one"):
        merge_stats([])
    with pytest.raises(FreezeError, match="piece 1 covers 2 layers over 5 steps"):
        merge_stats([LayerStats.zeros(3, 5), LayerStats.zeros(2, 5)])
    with pytest.raises(FreezeError, match="over 4 steps"):
        merge_stats([LayerStats.zeros(3, 5), LayerStats.zeros(3, 4)])


def _set_grads(module: nn.Module, value: float) -> None:
    for p in module.parameters():
        p.grad = torch.full_like(p, value)


def test_tracker_really_accumulates_gradients() -> None:
    # per-entry gradients +2, -1, +3 on a layer of 8 parameters: the summed gradient is +4 per entry, L1 = 32;
    # the last step alone would read 24 (the published bug) and a sum of per-step norms 48
    layer = nn.Linear(3, 2)  # 6 weights + 2 biases
    idle = nn.Linear(2, 2)
    tracker = GradNormTracker({1: layer, 2: idle})
    for value in (2.0, -1.0, 3.0):
        _set_grads(layer, value)
        tracker.accumulate()
    stats = tracker.local_stats(NUM_LAYERS)
    assert stats.steps == 3
    assert stats.l1 == (0.0, 32.0, 0.0, 0.0)
    assert stats.l2 == pytest.approx((0.0, math.sqrt(8 * 16.0), 0.0, 0.0))
    tracker.reset()
    assert tracker.local_stats(NUM_LAYERS) == LayerStats.zeros(NUM_LAYERS, 0)


def test_tracker_skips_frozen_parameters_and_keeps_fp32_sums() -> None:
    layer = nn.Linear(2, 2).to(torch.bfloat16)
    tracker = GradNormTracker({0: layer})
    layer.bias.requires_grad_(False)
    for _ in range(4):
        for p in layer.parameters():
            p.grad = torch.full_like(p, 1e-3)
        tracker.accumulate()
    stats = tracker.local_stats(1)
    assert stats.l1[0] == pytest.approx(4 * 4 * float(torch.tensor(1e-3, dtype=torch.bfloat16)), rel=1e-6)


def test_tracker_counts_a_shared_parameter_once_and_keeps_a_layer_frozen_mid_interval() -> None:
    shared = nn.Linear(2, 2)  # 4 weights + 2 biases, listed under layers 0 and 1
    other = nn.Linear(1, 1)
    tracker = GradNormTracker({0: shared, 1: nn.ModuleList([shared, other])})
    for step in range(3):
        _set_grads(shared, 1.0)
        _set_grads(other, 2.0)
        if step == 2:  # frozen before the last step: its sum stays what the first two steps gave
            for p in other.parameters():
                p.requires_grad_(False)
                p.grad = None
        tracker.accumulate()
    stats = tracker.local_stats(2)
    assert stats.steps == 3
    assert stats.l1 == (6 * 3.0, 2 * 4.0)  # the shared module counts for layer 0 only
    assert stats.l2 == pytest.approx((math.sqrt(6 * 9.0), math.sqrt(2 * 16.0)))


def test_tracker_rejects_layers_out_of_range() -> None:
    with pytest.raises(FreezeError, match="held indices in"):
        GradNormTracker({5: nn.Linear(1, 1)}).local_stats(4)
    with pytest.raises(FreezeError, match=">= 0"):
        GradNormTracker({-1: nn.Linear(1, 1)})


class _Block(nn.Module):
    """A layer made of two parts, so that a pipeline boundary can cut through it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(torch.tanh(self.a(x))))


def _train_and_track(layers_of: dict[int, list[str]] | None) -> tuple[nn.ModuleList, GradNormTracker]:
    torch.manual_seed(0)
    blocks = nn.ModuleList(_Block() for _ in range(NUM_LAYERS))
    if layers_of is None:
        held: dict[int, nn.Module] = dict(enumerate(blocks))
    else:
        held = {i: nn.ModuleList(getattr(blocks[i], part) for part in parts) for i, parts in layers_of.items()}
    tracker = GradNormTracker(held)
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        x = torch.randn(5, 4, generator=g)
        for block in blocks:
            x = block(x)
        blocks.zero_grad(set_to_none=True)
        x.square().mean().backward()
        tracker.accumulate()
    return blocks, tracker


def _stage_stats(ctx: RankContext) -> tuple[list[float], list[float], int, list[float], list[float]]:
    # two stages of one pipeline; the boundary cuts through layer 1 (rank 0 has its part a, rank 1 its part b)
    split = {0: {0: ["a", "b"], 1: ["a"]}, 1: {1: ["b"], 2: ["a", "b"], 3: ["a", "b"]}}[ctx.rank]
    _, tracker = _train_and_track(split)
    piece = tracker.local_stats(NUM_LAYERS).to_tensor()
    gathered = [torch.empty_like(piece) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, piece)
    merged = merge_stats([LayerStats.from_tensor(t) for t in gathered])
    _, whole = _train_and_track(None)
    full = whole.local_stats(NUM_LAYERS)
    return list(merged.l1), list(merged.l2), merged.steps, list(full.l1), list(full.l2)


@pytest.mark.distributed
def test_two_stages_merge_to_the_whole_model_statistics() -> None:
    for l1, l2, steps, full_l1, full_l2 in run_distributed(_stage_stats, 2, timeout=60):
        assert steps == 3
        assert l1 == pytest.approx(full_l1, rel=1e-12)
        assert l2 == pytest.approx(full_l2, rel=1e-12)
        assert all(v > 0 for v in l1)
