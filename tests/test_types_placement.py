"""Placement and virtual stages: Layout with ``virtual``, stage -> rank in loop and V style, layer ranges per rank."""

from __future__ import annotations

import pytest

from elastic_pipe.types import ElasticPipeError, ElasticPipeTypeError, Layout, Placement, stage_ranks


def _layout(pipe_len: int, virtual: int, frozen: int = 2) -> Layout:
    stages = pipe_len * virtual
    return Layout(frozen, pipe_len, 1, tuple(range(frozen, frozen + stages + 1)), 4, virtual=virtual)


@pytest.mark.parametrize(
    ("pipe_len", "virtual", "loop", "v"),
    [
        (2, 1, (0, 1), (0, 1)),
        (4, 1, (0, 1, 2, 3), (0, 1, 2, 3)),
        (2, 2, (0, 1, 0, 1), (0, 1, 1, 0)),
        (4, 2, (0, 1, 2, 3, 0, 1, 2, 3), (0, 1, 2, 3, 3, 2, 1, 0)),
    ],
)
def test_stage_ranks_loop_and_v(pipe_len: int, virtual: int, loop: tuple[int, ...], v: tuple[int, ...]) -> None:
    assert stage_ranks(pipe_len, virtual, "loop") == loop
    assert stage_ranks(pipe_len, virtual, "v") == v
    for style, expected in (("loop", loop), ("v", v)):
        placement = _layout(pipe_len, virtual).placement(style)
        assert placement.ranks == expected
        assert placement.num_stages == pipe_len * virtual
        # every stage sits on exactly one rank, each rank holds exactly `virtual` stages
        held = [s for r in range(pipe_len) for s in placement.stages_of(r)]
        assert sorted(held) == list(range(pipe_len * virtual))
        assert all(len(placement.stages_of(r)) == virtual for r in range(pipe_len))


def test_ranges_follow_boundaries() -> None:
    layout = Layout(1, 2, 3, (1, 3, 4, 7, 9), 4, virtual=2)
    loop, v = layout.placement("loop"), layout.placement("v")
    assert loop.stages_of(0) == (0, 2) and loop.ranges_of(0) == ((1, 3), (4, 7))
    assert loop.stages_of(1) == (1, 3) and loop.ranges_of(1) == ((3, 4), (7, 9))
    assert v.stages_of(0) == (0, 3) and v.ranges_of(0) == ((1, 3), (7, 9))
    assert v.stages_of(1) == (1, 2) and v.ranges_of(1) == ((3, 4), (4, 7))
    assert layout.num_stages == 4 and layout.world_size == 6
    assert layout.layers_per_stage == (2, 1, 3, 2)


def test_virtual_defaults_to_one_and_keeps_equality() -> None:
    plain = Layout(0, 2, 1, (0, 3, 6), 4)
    assert plain.virtual == 1 and plain == Layout(0, 2, 1, (0, 3, 6), 4, virtual=1)
    assert plain != Layout(0, 1, 1, (0, 3, 6), 4, virtual=2)
    assert plain.placement().ranges_of(1) == ((3, 6),)


def test_layout_refuses_boundaries_that_do_not_fit_virtual() -> None:
    with pytest.raises(ElasticPipeError, match=r"pipe_len \* virtual \+ 1 = 5"):
        Layout(0, 2, 1, (0, 3, 6), 4, virtual=2)
    with pytest.raises(ElasticPipeError, match="virtual >= 1"):
        Layout(0, 2, 1, (0, 3, 6), 4, virtual=0)
    with pytest.raises(ElasticPipeTypeError, match="virtual must be an int"):
        Layout(0, 2, 1, (0, 3, 6), 4, virtual="2")  # type: ignore[arg-type]


def test_bad_style_and_rank_are_refused() -> None:
    placement = _layout(2, 2).placement()
    with pytest.raises(ElasticPipeError, match="style must be one of"):
        _layout(2, 2).placement("zigzag")
    with pytest.raises(ElasticPipeTypeError, match="style must be a string"):
        stage_ranks(2, 2, 3)  # type: ignore[arg-type]
    with pytest.raises(ElasticPipeError, match="rank must be in"):
        placement.stages_of(2)
    with pytest.raises(ElasticPipeTypeError, match="rank must be an int"):
        placement.ranges_of("0")  # type: ignore[arg-type]
    with pytest.raises(ElasticPipeError, match="virtual must be an int >= 1"):
        stage_ranks(2, 0)


def test_placement_built_by_hand_must_agree_with_its_rule() -> None:
    good = _layout(2, 2).placement("v")
    assert Placement(good.style, 2, 2, good.ranks, good.ranges) == good
    with pytest.raises(ElasticPipeError, match=r"Placement\.ranks must be"):
        Placement("loop", 2, 2, good.ranks, good.ranges)
    with pytest.raises(ElasticPipeError, match="adjacent, non-empty"):
        Placement("v", 2, 2, good.ranks, good.ranges[:3])
    with pytest.raises(ElasticPipeError, match="adjacent, non-empty"):
        Placement("v", 2, 2, good.ranks, ((2, 3), (3, 3), (3, 5), (5, 6)))
    with pytest.raises(ElasticPipeError, match="adjacent, non-empty"):
        Placement("v", 2, 2, good.ranks, ((2, 3), (4, 5), (5, 6), (6, 7)))
