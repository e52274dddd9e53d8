"""The cache's work on a GPU runs every forward at the training step's batch size (``prefix.carry.at_rows``): a
shorter chunk is padded and the padding's outputs dropped, so a carry or fill never meets a batch size the steps
did not run; on the CPU it runs as it is. The carry itself goes a replica's batch at a time."""

from __future__ import annotations

from collections.abc import Callable

import torch

from elastic_pipe.cache import ActivationCache
from elastic_pipe.orchestrator.prefix.carry import at_rows, cache_runner, carry_entries

WIDTH = 3


def _recording(seen: list[int]) -> Callable[[torch.Tensor, int, int], torch.Tensor]:
    def run(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        seen.append(int(x.shape[0]))
        return x * 2.0 + (hi - lo)  # row by row, as a frozen prefix in eval mode

    return run


def test_a_short_batch_is_padded_to_the_size_and_only_its_own_rows_come_back() -> None:
    seen: list[int] = []
    run = at_rows(_recording(seen), 8)
    x = torch.arange(5 * WIDTH, dtype=torch.float64).reshape(5, WIDTH)
    out = run(x, 1, 3)
    assert seen == [8]
    assert torch.equal(out, x * 2.0 + 2)
    exact, longer = torch.ones(8, WIDTH), torch.ones(11, WIDTH)
    assert run(exact, 0, 1).shape == (8, WIDTH) and run(longer, 0, 1).shape == (11, WIDTH)
    assert seen == [8, 8, 11]  # a batch of the size, or longer, runs as it is
    assert run(torch.ones(0, WIDTH), 0, 1).shape == (0, WIDTH) and seen[-1] == 0  # nothing to pad with


def test_only_a_gpu_pads() -> None:
    seen: list[int] = []
    x = torch.ones(3, WIDTH)
    cache_runner(_recording(seen), 8, torch.device("cpu"))(x, 0, 1)
    cache_runner(_recording(seen), 8, torch.device("cuda"))(x, 0, 1)  # a device object: no GPU needed to build it
    assert seen == [3, 8]


def test_a_carry_runs_chunk_sized_forwards_and_moves_every_entry() -> None:
    n, chunk = 13, 4
    cache = ActivationCache(n, device_budget=1 << 20)
    ids = torch.arange(n)
    values = ids.double()[:, None] * 10.0 + torch.arange(WIDTH, dtype=torch.float64)
    cache.put(ids, 2, values)
    seen: list[int] = []
    carry_entries(cache, 2, 5, run=at_rows(_recording(seen), chunk), chunk=chunk)
    assert seen == [chunk] * 4  # 13 entries: three full chunks and one padded
    lookup = cache.get(ids, 5)
    assert lookup.num_hits == n
    assert torch.equal(lookup.values, values * 2.0 + 3)
    assert cache.boundaries() == [5]
