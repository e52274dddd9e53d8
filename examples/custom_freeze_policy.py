"""A custom freeze policy in under 30 lines, registered by name and run on a tiny model.

The policy: freeze the first active layer once its gradient norm has fallen below ``ratio`` times the largest norm
it has shown (gradients grow while a layer starts learning and shrink as it converges). Any object with the
FreezePolicy members works; no base class is needed.

Run:  python examples/custom_freeze_policy.py
      python examples/custom_freeze_policy.py --policy converged --epochs 20 \
          --options '{"threshold": 0.25, "patience": 2, "tolerance": null}'    (a built-in on the same model)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import nn

from elastic_pipe.freeze import GradNormTracker, LayerStats, decide, freeze_modules, make_policy, register_policy


# --- the policy (29 lines) ----------------------------------------------------------------------------------------
class PlateauFreeze:
    """Freeze one more layer when the first active layer's gradient norm fell below ``ratio`` x its peak norm."""

    name = "plateau"  # how snapshots and error messages call it
    needs_stats = True  # observe() reads gradient norms, so the runtime must collect them

    def __init__(self, num_layers: int, ratio: float = 0.5) -> None:
        self.num_layers, self.ratio = num_layers, ratio
        self.peak = [0.0] * num_layers
        self.latest: list[float] | None = None  # norms observed since the last decision

    def observe(self, stats: LayerStats) -> None:
        self.latest = list(stats.mean_l2())
        self.peak = [max(p, v) for p, v in zip(self.peak, self.latest, strict=True)]

    def observe_eval(self, loss: float) -> None:
        pass  # decides from gradient norms alone

    def propose(self, epoch: int, step: int, current: int) -> int:
        latest, self.latest = self.latest, None  # decide once per observation
        if latest is None or current == self.num_layers:
            return current
        return current + 1 if latest[current] < self.ratio * self.peak[current] else current

    def state_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "peak": self.peak, "latest": self.latest}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ratio, self.peak, self.latest = state["ratio"], list(state["peak"]), state["latest"]


# --- plugging it in -------------------------------------------------------------------------------------------------
NUM_LAYERS, WIDTH, STEPS_PER_EPOCH = 6, 16, 25


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="plateau", help="a registered policy name (default: the one above)")
    parser.add_argument("--options", default="{}", help="the policy's keyword options as a JSON object")
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    register_policy("plateau", PlateauFreeze, replace=True)
    policy = make_policy(args.policy, NUM_LAYERS, **json.loads(args.options))
    layers = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(NUM_LAYERS))
    head = nn.Linear(WIDTH, 1)
    optimizer = torch.optim.AdamW([*layers.parameters(), *head.parameters()], lr=3e-3)
    tracker = GradNormTracker(dict(enumerate(layers)))
    x = torch.randn(512, WIDTH)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    x_eval = torch.randn(256, WIDTH)  # held out: drawn after the training data, so that stays the same
    y_eval = (x_eval[:, :4].sum(dim=1, keepdim=True) > 0).float()
    frozen = 0
    for epoch in range(args.epochs):
        new = decide(policy, epoch, epoch * STEPS_PER_EPOCH, frozen)
        removed = freeze_modules(list(layers[frozen:new]), optimizer)
        frozen = new
        for step in range(STEPS_PER_EPOCH):
            batch = slice(step * 20, step * 20 + 20)
            h = x[batch]
            for layer in layers:
                h = layer(h)
            loss = nn.functional.binary_cross_entropy_with_logits(head(h), y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            tracker.accumulate()
            optimizer.step()
        policy.observe(tracker.local_stats(NUM_LAYERS))
        tracker.reset()
        with torch.no_grad():
            h = x_eval
            for layer in layers:
                h = layer(h)
            eval_loss = nn.functional.binary_cross_entropy_with_logits(head(h), y_eval).item()
        policy.observe_eval(eval_loss)  # every policy takes it; this one ignores it
        bar = "#" * frozen + "." * (NUM_LAYERS - frozen)
        print(
            f"epoch {epoch:>2}  frozen {frozen}  {bar}  loss {loss.item():.3f}  held-out {eval_loss:.3f}  "
            f"(removed {removed} tensors)"
        )


if __name__ == "__main__":
    main()
