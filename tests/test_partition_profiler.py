"""The profiler measures real modules on the CPU into LayerCost records."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from elastic_pipe.partition import PartitionError, profile_layers, solve, weights_from_costs


def test_profile_layers_records_sizes_and_times() -> None:
    torch.manual_seed(0)
    layers = [("proj", nn.Linear(16, 64)), ("act", nn.ReLU()), ("head", nn.Linear(64, 10))]
    frozen_head = layers[2][1]
    batch = 32
    records = profile_layers(layers, torch.randn(batch, 16), repeats=3, warmup=1)
    assert [r.name for r in records] == ["proj", "act", "head"]
    assert [r.params for r in records] == [16 * 64 + 64, 0, 64 * 10 + 10]
    assert [r.activation_bytes for r in records] == [batch * 64 * 4, batch * 64 * 4, batch * 10 * 4]
    proj, act, head = records
    # Adam: parameter + gradient + two moments = 16 bytes per fp32 parameter; Linear stores its input for backward.
    assert proj.memory_bytes == proj.params * 16 + batch * 16 * 4
    # ReLU stores its output only.
    assert act.memory_bytes == batch * 64 * 4
    assert head.frozen_memory_bytes == head.params * 4
    assert all(r.forward > 0 and r.backward > 0 and r.frozen_forward is not None for r in records)
    # gradients are left as found
    assert all(p.grad is None for p in frozen_head.parameters())
    # records feed the solvers directly
    assert solve(weights_from_costs(records, "memory"), 2).num_layers == 3


def test_profile_layers_respects_frozen_parameters() -> None:
    layer = nn.Linear(8, 8)
    layer.requires_grad_(False)
    (record,) = profile_layers(
        [("frozen", layer)], torch.randn(4, 8), repeats=1, warmup=0, optimizer_state_bytes_per_byte=0
    )
    # frozen parameters count once (no gradient, no optimizer state), and the input gradient of a frozen Linear
    # needs only its weight, so autograd stores no activation
    assert record.memory_bytes == record.params * 4
    assert record.backward > 0


def test_the_thread_clock_leaves_out_time_the_thread_spends_off_the_cpu() -> None:
    class Sleeps(nn.Module):
        """A layer whose forward is mostly waiting, as a layer looks when other processes hold the core."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.02)
            return x * 2

    layers = [("sleeps", Sleeps())]
    (wall,) = profile_layers(layers, torch.randn(4, 8), repeats=2, warmup=0)
    (thread,) = profile_layers(layers, torch.randn(4, 8), repeats=2, warmup=0, cpu_clock="thread")
    assert wall.forward >= 0.02 and wall.frozen_forward is not None and wall.frozen_forward >= 0.02
    assert thread.forward < 0.01 and thread.frozen_forward is not None and thread.frozen_forward < 0.01


def test_profile_layers_errors() -> None:
    with pytest.raises(PartitionError, match="layers is empty"):
        profile_layers([], torch.zeros(1))
    with pytest.raises(PartitionError, match="repeats must be an int >= 1"):
        profile_layers([("x", nn.ReLU())], torch.zeros(1), repeats=0)
    with pytest.raises(PartitionError, match="cpu_clock must be 'wall' or 'thread', got 'cpu'"):
        profile_layers([("x", nn.ReLU())], torch.zeros(1), cpu_clock="cpu")  # type: ignore[arg-type]

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    with pytest.raises(PartitionError, match="layer 'pair' returned tuple, expected one tensor"):
        profile_layers([("pair", Pair())], torch.zeros(1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_layers_on_cuda_uses_events_and_the_allocator() -> None:
    device = torch.device("cuda")
    layers = [("proj", nn.Linear(256, 1024).to(device)), ("act", nn.GELU()), ("out", nn.Linear(1024, 256).to(device))]
    batch = 64
    records = profile_layers(layers, torch.randn(batch, 256, device=device), repeats=5, warmup=2)
    proj, act, out = records
    assert [r.activation_bytes for r in records] == [batch * 1024 * 4, batch * 1024 * 4, batch * 256 * 4]
    # at least what the saved-tensor count gives on the CPU: the Linear's saved input, GELU's saved input
    assert proj.memory_bytes >= proj.params * 16 + batch * 256 * 4
    assert act.memory_bytes >= batch * 1024 * 4
    assert all(r.forward > 0 and r.backward > 0 for r in records)
    assert out.frozen_memory_bytes == out.params * 4
