"""``cache = "auto"`` measures whether reading the cache pays once, not at every transition (issue 41: the default
policy's transitions do only what pays), counted on the CPU: the frozen prefix's forward calls each decision runs.

Reading that paid at boundary ``b`` pays at a deeper boundary whose entries have the same shape and dtype and the
same spread over the tiers (the same bytes read from the same tiers, a longer prefix replaced), so
:class:`~elastic_pipe.orchestrator.prefix.fill.ReadsPaid` answers there without running the prefix; every other
boundary is measured.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import pytest
import torch
from torch import nn

from elastic_pipe import cache as acache
from elastic_pipe.orchestrator.data.workload import Split
from elastic_pipe.orchestrator.prefix.carry import CacheJob
from elastic_pipe.orchestrator.prefix.fill import ReadsPaid, _decide

SAMPLES, WIDTH, BATCH = 64, 16, 8

_defaults = inspect.signature(acache.measure_tiered_payoff).parameters
#: Prefix forwards one measure runs: one for the entries' shape, the warm-up runs and the timed runs.
MEASURE_FORWARDS = 1 + _defaults["warmup"].default + _defaults["repeats"].default


class _Slow(nn.Module):
    """A linear sub-layer that takes 2 ms (recomputing it is far slower than reading its output back)."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(2e-3)
        return self.linear(x)  # type: ignore[no-any-return]


def _job(cache: acache.ActivationCache, layers: nn.ModuleList, frozen: int, calls: list[tuple[int, int]]) -> CacheJob:
    """The cache job of boundary ``frozen`` over 64 samples; ``calls`` records each run's ``(lo, hi)``."""
    torch.manual_seed(0)
    data = Split(torch.randn(SAMPLES, WIDTH), torch.zeros(SAMPLES, dtype=torch.long), torch.arange(SAMPLES))

    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        calls.append((lo, hi))
        with torch.no_grad():
            for layer in layers[lo:hi]:
                x = layer(x)
        return x

    with torch.no_grad():  # the context's example outputs, computed before (not counted)
        example = data.input_rows(0, 1)
        for layer in layers[:frozen]:
            example = layer(example)
    return CacheJob(cache, data, 0, frozen, BATCH, torch.device("cpu"), run, example)


def _decider(
    cache: acache.ActivationCache, layers: nn.ModuleList, paid: ReadsPaid
) -> tuple[Callable[[int], tuple[bool, str]], list[tuple[int, int]]]:
    calls: list[tuple[int, int]] = []

    def decide(frozen: int) -> tuple[bool, str]:
        return _decide(_job(cache, layers, frozen, calls), mode="auto", per_replica=BATCH, paid=paid)

    return decide, calls


def _prefix_forwards(calls: list[tuple[int, int]]) -> int:
    return sum(lo == 0 for lo, _ in calls)


def _roomy() -> acache.ActivationCache:
    return acache.ActivationCache(SAMPLES, device_budget=1 << 20)


def test_reading_that_paid_is_not_measured_again_at_a_deeper_boundary_with_entries_alike() -> None:
    layers = nn.ModuleList(_Slow(WIDTH, WIDTH) for _ in range(4))
    paid = ReadsPaid()
    decide, calls = _decider(_roomy(), layers, paid)
    on, reason = decide(1)
    assert on and paid.measured == 1 and paid.boundary == 1
    assert _prefix_forwards(calls) == MEASURE_FORWARDS
    calls.clear()
    for frozen in (2, 4):
        on, reason = decide(frozen)
        assert on and reason.startswith("paid at boundary 1, entries alike")
    assert calls == [] and paid.measured == 1  # nothing ran for the two deeper boundaries


def test_other_entries_a_shallower_boundary_or_a_measure_that_said_no_are_measured() -> None:
    # sub-layer 2 narrows the entries: boundary 3's entries are not boundary 1's
    layers = nn.ModuleList([_Slow(WIDTH, WIDTH), _Slow(WIDTH, WIDTH), _Slow(WIDTH, WIDTH // 2), _Slow(WIDTH // 2, 4)])
    paid = ReadsPaid()
    decide, calls = _decider(_roomy(), layers, paid)
    for frozen in (2, 3, 1):  # paid at 2; 3 narrower; 1 shallower than 3
        assert decide(frozen)[0]
    assert paid.measured == 3 and _prefix_forwards(calls) == 3 * MEASURE_FORWARDS and paid.boundary == 1
    # no budget anywhere: every entry would be recomputed, reading never pays, and each boundary is measured
    paid, nowhere = ReadsPaid(), acache.ActivationCache(SAMPLES, device_budget=0)
    decide, calls = _decider(nowhere, layers, paid)
    assert not decide(1)[0] and not decide(2)[0]
    assert paid.measured == 2 and paid.boundary == 0 and _prefix_forwards(calls) == 2 * MEASURE_FORWARDS


def test_a_deeper_boundary_whose_entries_would_spread_over_the_tiers_otherwise_is_measured() -> None:
    layers = nn.ModuleList(_Slow(WIDTH, WIDTH) for _ in range(3))
    cache = acache.ActivationCache(SAMPLES, device_budget=SAMPLES * WIDTH * 4)  # room for one boundary's entries
    paid = ReadsPaid()
    decide, calls = _decider(cache, layers, paid)
    assert decide(1)[0]
    cache.put(torch.arange(8), 1, torch.ones(8, WIDTH))  # boundary 1 now holds the device's memory
    assert not decide(2)[0]  # its entries would all be recomputed (none fits): measured, and no read
    assert paid.measured == 2 and _prefix_forwards(calls) == 2 * MEASURE_FORWARDS


@pytest.mark.parametrize("reading", [True, False])
def test_cache_on_measures_nothing(reading: bool) -> None:
    layers = nn.ModuleList(_Slow(WIDTH, WIDTH) for _ in range(2))
    paid = ReadsPaid(boundary=int(reading))
    calls: list[tuple[int, int]] = []
    job = _job(_roomy(), layers, 2, calls)
    assert _decide(job, mode="on", per_replica=BATCH, paid=paid) == (True, "cache = 'on'")
    assert calls == [] and paid.measured == 0
