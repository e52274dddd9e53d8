"""``OutputDrift``'s kept outputs as a checkpoint holds them: a restored piece measures exactly what the original
does, and a bad entry is refused by name without changing anything."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from elastic_pipe.freeze import FreezeError, OutputDrift


def _kept() -> OutputDrift:
    drift = OutputDrift()
    drift.measure({1: torch.tensor([[3.0, 4.0]]), 2: torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}, 4)
    return drift


def test_a_restored_piece_measures_exactly_what_the_original_does() -> None:
    original = _kept()
    saved = original.state_dict()
    assert list(saved) == [1, 2]
    assert saved[2].dtype == torch.bfloat16  # the bits as kept, not a float32 copy
    assert all(t.device.type == "cpu" for t in saved.values())
    restored = OutputDrift()
    restored.load_state_dict(saved, num_layers=4, device="cpu")
    assert restored.held == (1, 2)
    now = {1: torch.tensor([[3.0, 5.0]]), 2: torch.tensor([1.0, -2.0], dtype=torch.bfloat16)}
    expected = ((0.0, 1.0, 0.25, 0.0), (0.0, 25.0, 6.25, 0.0))
    assert restored.measure(now, 4) == original.measure(now, 4) == expected


def test_the_saved_outputs_are_copies() -> None:
    drift = _kept()
    saved = drift.state_dict()
    saved[1].add_(100.0)  # changing the saved tensor leaves the kept one alone
    assert drift.measure({1: torch.tensor([[3.0, 4.0]])}, 4)[0][1] == 0.0
    h = torch.tensor([[3.0, 4.0]])
    restored = OutputDrift()
    restored.load_state_dict({1: h})
    h.add_(100.0)  # and the loaded tensor is kept as a copy too
    assert restored.measure({1: torch.tensor([[3.0, 4.0]])}, 4)[0][1] == 0.0


def test_an_empty_state_keeps_nothing() -> None:
    drift = _kept()
    drift.load_state_dict({})
    assert drift.held == ()
    assert drift.state_dict() == {}
    assert drift.measure({0: torch.ones(2)}, 2) == ((math.inf, 0.0), (0.0, 0.0))  # nothing to compare with


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({-1: torch.zeros(2)}, r"layer index -1 is not an integer >= 0"),
        ({"1": torch.zeros(2)}, r"layer index '1' is not an integer >= 0"),
        ({True: torch.zeros(2)}, r"layer index True is not an integer >= 0"),
        ({4: torch.zeros(2)}, r"layer 4 outside \[0, 4\)"),
        ({0: torch.zeros(2), 3: [0.0, 1.0]}, r"layer 3's output is list, expected a floating-point tensor"),
        ({2: torch.zeros(2, dtype=torch.int64)}, r"layer 2's output is a torch.int64 tensor, expected a floating"),
    ],
)
def test_a_bad_entry_is_refused_by_name_and_changes_nothing(state: dict[Any, Any], message: str) -> None:
    drift = _kept()
    before = drift.state_dict()
    with pytest.raises(FreezeError, match=message):
        drift.load_state_dict(state, num_layers=4)
    after = drift.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[i], before[i]) for i in before)
