"""Gradient averaging over replicas: overlapped with the backward pass, or after it - the same means."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe.orchestrator.stage.grad_sync import OverlappedAverager, average_gradients
from elastic_pipe.testing import RankContext, run_distributed

pytestmark = pytest.mark.distributed


def _model() -> nn.Module:
    torch.manual_seed(0)
    # an unused layer: its bucket never completes in the backward pass and is finished afterwards
    return nn.ModuleDict(
        {
            "a": nn.Linear(5, 7, dtype=torch.float64),
            "b": nn.Linear(7, 3, dtype=torch.float64),
            "unused": nn.Linear(2, 2),
        }
    )


def _backward(model: nn.Module, rank: int) -> None:
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    model["b"](torch.tanh(model["a"](x))).pow(2).sum().backward()


def _both_ways(ctx: RankContext) -> dict[str, Any]:
    group = dist.new_group([0, 1])
    overlapped, after = _model(), _model()
    # tiny buckets: several all-reduces, launched from inside the backward pass
    averager = OverlappedAverager(list(overlapped.parameters()), group=group, replicas=2, cap_bytes=64)
    out: dict[str, Any] = {}
    for step in range(2):  # the averager resets between steps
        overlapped.zero_grad(set_to_none=True)
        after.zero_grad(set_to_none=True)
        _backward(overlapped, ctx.rank + 10 * step)
        _backward(after, ctx.rank + 10 * step)
        out[f"in_flight{step}"] = averager.in_flight  # started during the backward pass
        out[f"ops{step}"] = averager.finish()
        average_gradients([p.grad for p in after.parameters() if p.grad is not None], group=group, replicas=2)
        out[f"overlapped{step}"] = [p.grad.tolist() if p.grad is not None else None for p in overlapped.parameters()]
        out[f"after{step}"] = [p.grad.tolist() if p.grad is not None else None for p in after.parameters()]
    averager.remove()
    local = copy.deepcopy(overlapped)
    local.zero_grad(set_to_none=True)
    _backward(local, ctx.rank)  # no hooks left: this rank's own gradient, not a mean
    out["local"] = [p.grad.tolist() for p in local["a"].parameters()]
    return out


def test_overlapped_averaging_equals_averaging_after_the_backward_pass() -> None:
    r0, r1 = run_distributed(_both_ways, 2, timeout=60.0)
    for step in range(2):
        assert r0[f"ops{step}"] == r1[f"ops{step}"] >= 2
        # every bucket of a used layer was all-reducing before finish(); the unused layer's had no gradient
        assert r0[f"in_flight{step}"] == r0[f"ops{step}"]
        for r in (r0, r1):
            assert r[f"overlapped{step}"] == r[f"after{step}"]  # (a + b) / 2 either way: bit for bit
        assert r0[f"overlapped{step}"] == r1[f"overlapped{step}"]  # every replica holds the same mean
    assert r0["local"] != r1["local"]  # after remove(), gradients stay local
