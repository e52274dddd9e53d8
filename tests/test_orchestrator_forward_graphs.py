"""``ForwardGraphs``, the probe's CUDA-graph replay: eager off CUDA; on a GPU warm-up, capture, replay that equals the
eager forward bit for bit (also after the weights change in place, under bf16 autocast), and a fallback that names
a failed capture."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from elastic_pipe.orchestrator.stage.forward_graphs import ForwardGraphs

_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _net(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.5), nn.Linear(16, 8)).to(device).eval()


def test_off_cuda_every_call_runs_eagerly_in_eval_mode_under_the_autocast_dtype() -> None:
    net = _net("cpu")
    x = torch.randn(4, 8)
    graphs = ForwardGraphs(torch.device("cpu"), autocast_dtype=torch.bfloat16)
    net.train()
    net[0].eval()  # a mixed model: each module's own mode comes back
    built: list[int] = []

    def build() -> nn.Module:
        built.append(1)
        return net

    outs = [graphs.run("net", x, build) for _ in range(3)]
    assert len(built) == 3  # eager every time: built every time
    assert [m.training for m in net] == [False, True, True, True] and net.training
    assert not graphs.enabled and graphs.replaying == 0 and graphs.captures == 0
    net.eval()  # what the segment ran in: no dropout
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = net(x)
    assert all(o.dtype == torch.bfloat16 and torch.equal(o, expected) for o in outs)
    assert not outs[0].requires_grad  # no gradients, whatever the parameters want
    plain = ForwardGraphs(torch.device("cpu")).run("net", x, lambda: net)
    assert plain.dtype == torch.float32


@pytest.mark.gpu
@_GPU
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_replays_equal_the_eager_forward_also_after_an_in_place_update(dtype: torch.dtype | None) -> None:
    net = _net("cuda")
    net.train()  # the segment runs in eval mode whatever the model's mode; replays switch nothing
    x = torch.randn(4, 8, device="cuda")
    graphs = ForwardGraphs(torch.device("cuda"), autocast_dtype=dtype)

    def eager(inp: torch.Tensor) -> torch.Tensor:
        net.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            out = net(inp)
        net.train()
        return out

    first = graphs.run("net", x, lambda: net).clone()  # the warm-up: eager
    assert graphs.captures == 0 and torch.equal(first, eager(x))
    static = graphs.run("net", x, lambda: net)  # captured, then replayed
    second = static.clone()
    assert graphs.captures == 1 and graphs.replaying == 1 and graphs.capture_s > 0
    assert torch.equal(second, eager(x))
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1.5).add_(0.01)  # an optimizer step: in place
    y = torch.randn(4, 8, device="cuda")
    third = graphs.run("net", y, lambda: net)
    assert graphs.captures == 1  # the same segment: replayed, not captured again
    assert torch.equal(third, eager(y)) and not torch.equal(third.float(), second.float())
    assert third.data_ptr() == static.data_ptr()  # the static output: overwritten by each replay
    assert net.training and all(m.training for m in net)  # no mode switch left behind
    # another input shape is another segment: warm-up, then its own capture
    z = torch.randn(2, 8, device="cuda")
    graphs.run("net", z, lambda: net)
    assert torch.equal(graphs.run("net", z, lambda: net), eager(z)) and graphs.captures == 2
    graphs.clear()
    assert graphs.replaying == 0


@pytest.mark.gpu
@_GPU
def test_a_segment_that_cannot_be_captured_runs_eagerly_and_says_why() -> None:
    net = _net("cuda")

    class Syncs(nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            out = net(inp)
            return out * float(out.abs().max().item() > 0)  # a read-back: not allowed inside a capture

    x = torch.randn(4, 8, device="cuda")
    graphs = ForwardGraphs(torch.device("cuda"))
    syncs = Syncs()
    results = [graphs.run("syncs", x, lambda: syncs) for _ in range(3)]
    assert graphs.replaying == 0 and graphs.captures == 0
    ((segment, reason),) = graphs.failures.items()
    assert segment == ("syncs", (4, 8), torch.float32) and reason.startswith("capture failed")
    with torch.no_grad():
        expected = net(x)
    assert all(torch.equal(r, expected) for r in results)
    # after a failed capture the device still works and other segments still capture
    graphs.run("net", x, lambda: net)
    assert torch.equal(graphs.run("net", x, lambda: net), expected) and graphs.captures == 1
