"""freeze_modules: frozen parameters leave the optimizer; active ones keep their exact state, step by step."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from elastic_pipe.freeze import freeze_modules

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]

OPTIMIZERS: dict[str, OptimizerFactory] = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-3),
}
LAYERS = 5
WIDTH = 6
HISTORY_STEPS = 4
AFTER_STEPS = 5


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, WIDTH, generator=g), torch.randn(8, WIDTH, generator=g)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    x, y = _batch(step)
    # set_to_none=False on purpose: zero gradient tensors are what lets momentum move a frozen parameter
    optimizer.zero_grad(set_to_none=False)
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("frozen", [1, 3])
def test_continuing_matches_an_optimizer_that_never_held_the_frozen_layers(name: str, frozen: int) -> None:
    make = OPTIMIZERS[name]
    model = _model()
    optimizer = make(list(model.parameters()))
    for step in range(HISTORY_STEPS):
        _train_step(model, optimizer, step)

    # the reference: the same model and history, and an optimizer holding only the active parameters
    reference = copy.deepcopy(model)
    for p in reference[:frozen].parameters():
        p.requires_grad_(False)
    active = [(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True)][2 * frozen :]
    ref_optimizer = make([q for _, q in active])
    for p, q in active:
        ref_optimizer.state[q] = copy.deepcopy(optimizer.state[p])

    frozen_params = list(model[:frozen].parameters())
    before = [p.detach().clone() for p in frozen_params]
    removed = freeze_modules(list(model[:frozen]), optimizer)

    assert removed == 2 * frozen
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert all(id(p) not in held and p not in optimizer.state and not p.requires_grad for p in frozen_params)
    for step in range(HISTORY_STEPS, HISTORY_STEPS + AFTER_STEPS):
        _train_step(model, optimizer, step)
        _train_step(reference, ref_optimizer, step)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(p, q), f"{name}: parameters diverged at step {step}"
        for p, q in active:
            for key, value in optimizer.state[p].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(ref_optimizer.state[q][key])), key
    assert all(torch.equal(p, b) for p, b in zip(frozen_params, before, strict=True))


def test_requires_grad_alone_lets_momentum_move_frozen_weights() -> None:
    # the control: without leaving the optimizer, a "frozen" layer keeps drifting - what the test above rules out
    model = _model()
    optimizer = OPTIMIZERS["sgd-momentum"](list(model.parameters()))
    for step in range(HISTORY_STEPS):
        _train_step(model, optimizer, step)
    for p in model[0].parameters():
        p.requires_grad_(False)
    before = model[0].weight.detach().clone()
    _train_step(model, optimizer, HISTORY_STEPS)
    assert not torch.equal(model[0].weight, before)


def test_empty_groups_are_kept_for_lr_schedulers() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(
        [{"params": list(model[0].parameters()), "lr": 1e-3}, {"params": list(model[1:].parameters())}], lr=1e-2
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _train_step(model, optimizer, 0)
    scheduler.step()
    assert freeze_modules([model[0]], optimizer) == 2
    assert [len(g["params"]) for g in optimizer.param_groups] == [0, 2 * (LAYERS - 1)]
    _train_step(model, optimizer, 1)
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([2.5e-4, 2.5e-3])
    # a checkpoint taken after freezing loads into a fresh optimizer over the same groups
    fresh = torch.optim.AdamW([{"params": [], "lr": 1e-3}, {"params": list(model[1:].parameters())}], lr=1e-2)
    fresh.load_state_dict(optimizer.state_dict())
    assert torch.equal(fresh.state[model[1].weight]["exp_avg"], optimizer.state[model[1].weight]["exp_avg"])


def test_freeze_is_idempotent_and_works_without_optimizer() -> None:
    model = _model()
    assert freeze_modules([model[0], model[0]], None) == 2  # shared modules count once
    assert freeze_modules([model[0]], None) == 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert freeze_modules([model[0], model[1]], optimizer) == 4  # model[0] was frozen but still held
    assert freeze_modules([model[1]], optimizer) == 0
    assert model[0].weight.grad is None and not model[1].bias.requires_grad
