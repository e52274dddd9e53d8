"""``holdings.fuse_on_device``: the config's AdamW runs fused once its parameters are on a GPU, also when it already
holds a checkpoint's state (a resumed run), so the resumed steps are the uninterrupted run's, bit for bit.

The GPU check is ``optim.can_fuse`` (as ``holdings`` calls it); these tests answer it for CPU parameters, where
torch runs fused AdamW as well. On a GPU, ``tests/test_training_resume.py::test_resume_with_dropout_on_cuda_is_exact``
covers the same path end to end (before this, the resumed run stepped with multi-tensor AdamW and ended 1e-17 to
1e-13 away from the uninterrupted run)."""

from __future__ import annotations

import pytest
import torch

from elastic_pipe.orchestrator.transition import holdings


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64)), torch.nn.Parameter(torch.randn(3))]


def _step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], k: int) -> None:
    for j, p in enumerate(params):
        p.grad = torch.sin(torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) * (k + 1) + j)
    optimizer.step()


def _as_saved(optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    """Each parameter's state as a checkpoint keeps it: tensors on the CPU (``snapshot.OptimizerShare.state_dict``)."""
    params = optimizer.param_groups[0]["params"]
    return [{k: v.detach().cpu().clone() for k, v in optimizer.state[p].items()} for p in params]


@pytest.fixture
def on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holdings, "can_fuse", lambda params: True)


@pytest.mark.usefixtures("on_gpu")
def test_an_adamw_that_holds_restored_state_runs_fused_and_steps_as_the_uninterrupted_run() -> None:
    clean = _params()
    uninterrupted = torch.optim.AdamW(clean, lr=0.01, fused=True)
    for k in range(3):
        _step(uninterrupted, clean, k)

    first = _params()
    before = torch.optim.AdamW(first, lr=0.01, fused=True)
    for k in range(2):
        _step(before, first, k)
    saved = _as_saved(before)

    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    optimizer = torch.optim.AdamW(resumed, lr=0.01)  # built before the parameters reach the device: not fused
    for p, s in zip(resumed, saved, strict=True):  # restored as snapshot.OptimizerShare does, non-fused
        optimizer.state[p] = {k: (v if k == "step" else v.to(p.device)) for k, v in s.items()}
    assert holdings.fuse_on_device(optimizer)
    assert optimizer.defaults["fused"] and all(g["fused"] for g in optimizer.param_groups)
    for p in resumed:
        step = optimizer.state[p]["step"]
        assert step.dtype == torch.float32 and step.device == p.device and float(step) == 2.0
    _step(optimizer, resumed, 2)
    for a, b in zip(resumed, clean, strict=True):
        assert torch.equal(a, b)


@pytest.mark.usefixtures("on_gpu")
def test_fusion_is_left_alone_where_it_was_chosen_or_cannot_run() -> None:
    params = _params()
    assert not holdings.fuse_on_device(torch.optim.AdamW(params, lr=0.01, fused=False))  # the user's choice
    assert not holdings.fuse_on_device(torch.optim.SGD(params, lr=0.01))


def test_parameters_off_the_gpu_keep_the_optimizer_as_built() -> None:
    optimizer = torch.optim.AdamW(_params(), lr=0.01)
    assert not holdings.fuse_on_device(optimizer)
    assert optimizer.defaults.get("fused") is None
