"""The default freeze policy (``drift``) in a plain PyTorch loop, with the frozen prefix's outputs cached.

What it shows:
  * ``Drift(num_units, total_steps=...)`` with its defaults (the setting the accuracy study measured, docs/freeze.md
    "The default policy"), asked four times per epoch, the rhythm those defaults were measured at;
  * its signal: each unit's output on a fixed probe batch (eval mode), compared between decision points by
    ``OutputDrift`` and ``relative_change``; the probe starts at the frozen boundary, whose output never changes;
  * ``freeze_modules`` for the newly frozen units, which then run once per sample into a cache of their output;
  * two runs of the same small ViT fine-tuned on digits 5-9: one pre-trained on digits 0-4 first, one from its
    initial weights. It prints when each run froze what: a unit freezes early only while it moves by at most 15%
    as much as the highest watched one (a pre-trained MiniLM's two lowest blocks do, at the first decision point),
    and the rest up to the cap (the lower two thirds: 4 of this ViT's 6 blocks) once that one has settled, not
    before 80% of the run; the top third keeps training (on this small model both runs adapt as a whole).

Run:  python examples/drift_default_policy.py [--epochs 8] [--json out.json]     (about a minute on a laptop CPU)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from elastic_pipe import freeze, models
from elastic_pipe.data import load_digits
from elastic_pipe.models.sublayer import SubLayerModel

VIT = {"depth": 6, "dim": 64, "heads": 4, "mlp_dim": 128, "patch_size": 4, "image_size": 8, "dropout": 0.0}
BATCH, PROBE = 32, 16


def build(num_classes: int) -> SubLayerModel:
    return models.vit("vit-tiny", num_classes=num_classes, **VIT)


def probe_outputs(model: SubLayerModel, h: torch.Tensor, first: int, limit: int) -> dict[int, torch.Tensor]:
    """Units ``first .. limit - 1``'s outputs on the probe batch, from ``h`` (its activation where ``first`` starts)."""
    outputs, start, was = {}, model.prefix_len(first), model.training
    model.eval()
    with torch.no_grad():
        for u in range(first, limit):
            end = model.unit_bounds(u)[1]
            h = outputs[u] = model.slice(start, end)(h)
            start = end
    model.train(was)
    return outputs


def fine_tune(model: SubLayerModel, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> dict[str, Any]:
    """Fine-tune ``model`` on ``(x, y)`` under the default drift policy; returns the freeze timeline and accuracy."""
    torch.manual_seed(seed)
    n_test = len(y) // 5
    (x_test, x_train), (y_test, y_train) = x.split([n_test, len(y) - n_test]), y.split([n_test, len(y) - n_test])
    per_epoch = len(y_train) // BATCH
    total = per_epoch * epochs
    units = model.num_units
    policy = freeze.make_policy("drift", units, total_steps=total)  # the trainer fills total_steps in the same way
    every = max(1, per_epoch // policy.decisions_per_epoch)  # type: ignore[attr-defined]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    drift, probe = freeze.OutputDrift(), x_train[:PROBE]
    outputs = probe_outputs(model, probe, 0, units)
    drift.measure(outputs, units)  # the baseline
    cache: dict[int, torch.Tensor] = {}  # sample -> the frozen prefix's output (at the current boundary)
    frozen, timeline, step = 0, [], 0
    for epoch in range(epochs):
        order = torch.randperm(len(y_train))
        for k in range(per_epoch):
            if step and step % every == 0 and frozen < units:
                fresh = probe_outputs(model, outputs.get(frozen - 1, probe), frozen, units)
                outputs.update(fresh)
                policy.observe_drift(freeze.relative_change(*drift.measure(fresh, units)))  # type: ignore[attr-defined]
                new = freeze.decide(policy, epoch, step, frozen)
                if new > frozen:
                    freeze.freeze_modules([m for u in range(frozen, new) for m in model.unit_modules(u)], optimizer)
                    frozen, cache = new, {}  # a deeper boundary: the cached outputs are refilled as samples come
                    timeline.append((step, frozen))
                    print(f"  step {step:4d}: {frozen} of {units} units frozen")
            ids = order[k * BATCH : (k + 1) * BATCH].tolist()
            boundary = model.prefix_len(frozen)
            if boundary:
                missing = [i for i in ids if i not in cache]
                if missing:
                    with torch.no_grad():  # the frozen prefix runs in eval mode, once per sample
                        rows = model.slice(0, boundary).eval()(x_train[missing])
                    cache.update(zip(missing, rows, strict=True))
                h = torch.stack([cache[i] for i in ids])
            else:
                h = x_train[ids]
            loss = F.cross_entropy(model.slice(boundary, model.num_sublayers)(h), y_train[ids])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    return {"timeline": timeline, "steps": total, "decide_every": every, "accuracy": accuracy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=8, help="fine-tuning epochs (default 8)")
    parser.add_argument("--pretrain-epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write both runs' timelines and accuracy here")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.pretrain_epochs < 0:
        parser.error(f"--epochs must be >= 1 and --pretrain-epochs >= 0, got {args.epochs}, {args.pretrain_epochs}")
    torch.set_num_threads(min(4, torch.get_num_threads()))
    digits = load_digits()
    low, high = digits.labels < 5, digits.labels >= 5
    torch.manual_seed(args.seed)
    start = build(5)  # the model to fine-tune: pre-trained on digits 0-4 ...
    optimizer = torch.optim.AdamW(start.parameters(), lr=1e-3)
    x_low, y_low = digits.inputs[low], digits.labels[low]
    for _ in range(args.pretrain_epochs):
        for ids in torch.randperm(len(y_low)).split(BATCH):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(start(x_low[ids]), y_low[ids]).backward()
            optimizer.step()
    x, y = digits.inputs[high], digits.labels[high] - 5  # ... then fine-tuned on 5-9 with a new head
    fresh = build(5).state_dict()
    new_head = {k: v for k, v in fresh.items() if k.startswith("head.")}
    runs = {}
    for name, weights in (("pre-trained on 0-4", {**start.state_dict(), **new_head}), ("initial weights", fresh)):
        model = build(5)
        model.load_state_dict(weights)
        print(f"{name}: fine-tuning {args.epochs} epochs on digits 5-9")
        runs[name] = fine_tune(model, x, y, args.epochs, args.seed)
        r = runs[name]
        first = r["timeline"][0][0] if r["timeline"] else None
        share = "-" if first is None else f"{first / r['steps']:.0%}"
        print(
            f"  accuracy {r['accuracy']:.1%}; first freeze at step {first} of {r['steps']} ({share} of the run), "
            f"decisions every {r['decide_every']} steps"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
    return 0 if all(math.isfinite(r["accuracy"]) for r in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
