"""Wire a built-in freeze policy into a plain training loop, checkpoint it mid-run, and resume identically.

What it shows:
  * GradNormTracker accumulating per-layer gradients over each epoch, fed to the policy with observe();
  * decide() at each epoch start and freeze_modules() for the newly frozen layers (they leave the optimizer);
  * a checkpoint (model, optimizer, policy.state_dict()) taken at epoch 3, and a second run resumed from it that
    ends with the same frozen count and bit-identical weights as the uninterrupted run.

Run:  python examples/freeze_training_loop.py [--policy autofreeze|paper|alpha]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elastic_pipe.freeze import GradNormTracker, decide, freeze_modules, make_policy

NUM_LAYERS, WIDTH, EPOCHS, STEPS_PER_EPOCH, BATCH, CHECKPOINT_EPOCH = 8, 16, 8, 10, 32, 3
OPTIONS: dict[str, dict[str, Any]] = {"autofreeze": {}, "paper": {"alpha": 1 / 3}, "alpha": {"alpha": 1 / 3}}


def build() -> tuple[nn.ModuleList, nn.Linear]:
    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(NUM_LAYERS))
    return layers, nn.Linear(WIDTH, 1)


def batch(epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(epoch * 1000 + step)
    x = torch.randn(BATCH, WIDTH, generator=g)
    return x, x[:, :3].prod(dim=1, keepdim=True)


def train(policy_name: str, start: Path | None, save: Path | None) -> tuple[list[int], list[torch.Tensor]]:
    """Train from scratch (or from the checkpoint ``start``); save a checkpoint at CHECKPOINT_EPOCH to ``save``."""
    layers, head = build()
    policy = make_policy(policy_name, NUM_LAYERS, **OPTIONS[policy_name])
    frozen, first_epoch = 0, 0
    if start is not None:
        ckpt = torch.load(start, weights_only=True)
        first_epoch, frozen = ckpt["epoch"], ckpt["frozen"]
        freeze_modules(list(layers[:frozen]), None)  # rebuild the frozen prefix before the optimizer
        layers.load_state_dict(ckpt["layers"])
        head.load_state_dict(ckpt["head"])
        policy.load_state_dict(ckpt["policy"])
    params = [p for p in [*layers.parameters(), *head.parameters()] if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    if start is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    tracker = GradNormTracker(dict(enumerate(layers)))
    plan = []
    for epoch in range(first_epoch, EPOCHS):
        if save is not None and epoch == CHECKPOINT_EPOCH:
            state = {"layers": layers.state_dict(), "head": head.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "policy": policy.state_dict(), "epoch": epoch, "frozen": frozen}, save)
        new = decide(policy, epoch, epoch * STEPS_PER_EPOCH, frozen)
        freeze_modules(list(layers[frozen:new]), optimizer)
        frozen = new
        plan.append(frozen)
        for step in range(STEPS_PER_EPOCH):
            x, y = batch(epoch, step)
            for layer in layers:
                x = layer(x)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(head(x), y).backward()  # type: ignore[no-untyped-call]
            tracker.accumulate()
            optimizer.step()
        policy.observe(tracker.local_stats(NUM_LAYERS))
        tracker.reset()
    return plan, [p.detach().clone() for p in [*layers.parameters(), *head.parameters()]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=sorted(OPTIONS), default="autofreeze")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.pt"
        plan, weights = train(args.policy, None, path)
        tail, resumed = train(args.policy, path, None)
    print(f"policy {args.policy}: frozen count per epoch {plan}")
    print(f"resumed at epoch {CHECKPOINT_EPOCH}:        {[None] * CHECKPOINT_EPOCH + tail}")
    same = tail == plan[CHECKPOINT_EPOCH:] and all(torch.equal(a, b) for a, b in zip(weights, resumed, strict=True))
    print("resumed run identical to the uninterrupted one:", same)
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
