"""The one layout rule (orchestrator.layout.rule): exact per-epoch layouts for a freeze schedule."""

from __future__ import annotations

import pytest

from elastic_pipe.freeze import FreezeError, ManualSchedule
from elastic_pipe.orchestrator.layout.compression import COMPRESSION_RULES
from elastic_pipe.orchestrator.layout.rule import layout_sequence, max_frozen_units

# Ten sub-layers of cost 1: the embedding with block 0 (unit 0 ends at 3), blocks 1-3, the head.
RULE_COSTS = [1.0] * 10
RULE_UNIT_ENDS = (3, 5, 7, 9)


def _rule(
    compression: str, schedule: dict[int, int], epochs: int = 5
) -> list[tuple[int, int, int, tuple[int, ...], int]]:
    sequence = layout_sequence(
        RULE_COSTS,
        RULE_UNIT_ENDS,
        ManualSchedule(len(RULE_UNIT_ENDS), schedule),
        epochs=epochs,
        steps_per_epoch=3,
        pipe_len=4,
        world_size=4,
        compression=COMPRESSION_RULES[compression],
        solver="optimal",
        microbatches_for=lambda k: 2 * k,
    )
    return [(x.frozen, x.pipe_len, x.replicas, x.boundaries, x.microbatches) for _, x in sequence]


def test_halving_within_the_initial_bottleneck() -> None:
    # Budget: the initial bottleneck, 3. Seven active sub-layers need 4 per stage on 2 stages (> 3): stay at 4;
    # five fit 2 stages of 3; three fit one stage.
    assert _rule("halving", {1: 1, 2: 2, 3: 3, 4: 4}) == [
        (0, 4, 1, (0, 3, 6, 9, 10), 8),
        (3, 4, 1, (3, 5, 7, 9, 10), 8),
        (5, 2, 2, (5, 8, 10), 4),
        (7, 1, 4, (7, 10), 2),
        (9, 1, 4, (9, 10), 2),
    ]


def test_without_compression_a_sub_layer_per_stage_stays_active() -> None:
    # Four stages need four active sub-layers: at most two units (five sub-layers) freeze.
    assert _rule("none", {1: 1, 2: 2, 3: 3, 4: 4})[2:] == [(5, 4, 1, (5, 7, 8, 9, 10), 8)] * 3
    assert max_frozen_units(RULE_UNIT_ENDS, 10, 4) == 2 and max_frozen_units(RULE_UNIT_ENDS, 10, 1) == 4


def test_an_unchanged_decision_keeps_the_layout() -> None:
    layouts = _rule("memory", {1: 2}, epochs=4)
    assert [x[0] for x in layouts] == [0, 5, 5, 5] and layouts[1] == layouts[2] == layouts[3]


def test_epoch_zero_always_runs_the_initial_layout() -> None:
    # a decision point exists only before epochs 1, 2, ...: a schedule asking for frozen units at epoch 0 waits
    assert _rule("halving", {0: 2}, epochs=2)[0] == (0, 4, 1, (0, 3, 6, 9, 10), 8)


def test_a_policy_that_unfreezes_is_refused() -> None:
    with pytest.raises(FreezeError, match="never unfreeze"):
        _rule("halving", {1: 2, 2: 1}, epochs=3)
