"""The default freeze policy in a PyTorch Lightning script: one callback, state in Lightning's own checkpoints.

What it shows:
  * ``FreezeCallback(blocks=...)`` added to an unchanged ``lightning.Trainer``: the drift policy (the default) with
    its probe, deciding four times per epoch; the blocks of a model the adapters do not know, listed by a function
    (the embedding freezes with the first block);
  * ``frozen_blocks`` logged with ``pl_module.log`` (it is in ``trainer.callback_metrics``);
  * the callback's state inside Lightning's checkpoints: the run is cut after half its epochs and resumed from the
    checkpoint with ``ckpt_path=``; the resumed run ends with the same frozen count, decisions and weights as the
    uninterrupted one;
  * the same run without the callback, for the accuracy and time side by side.

A small residual MLP over 8x8 digits (the first 1,000 images train, the rest are held out), on CPU.
Run:  python examples/lightning_freeze.py [--epochs 12] [--json out.json]            (under a minute)
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from elastic_pipe.data import load_digits
from elastic_pipe.integrations.lightning import FreezeCallback

TRAIN, WIDTH, DEPTH = 1000, 64, 6


class Residual(pl.LightningModule):
    """An embedding, ``DEPTH`` residual blocks and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(64, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(DEPTH)
        )
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.flatten(1))
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def blocks(module: Residual) -> list[Any]:
    """The freeze units: the embedding with the first block, then one block each."""
    return [[module.embed, module.blocks[0]], *module.blocks[1:]]


def fit(freeze: bool, epochs: int, seed: int, root: Path, ckpt: str | None = None) -> dict[str, Any]:
    digits = load_digits()
    x, y = digits.inputs, digits.labels
    pl.seed_everything(seed, verbose=False)
    model = Residual()
    callback = FreezeCallback(blocks=blocks)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=root, every_n_epochs=1, save_top_k=-1)
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[callback, checkpoints] if freeze else [checkpoints],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # a fixed order: Lightning does not restore the global RNG a shuffling sampler draws from, and this run is
    # resumed to show that the resumed run matches the uninterrupted one
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:TRAIN], y[:TRAIN]), batch_size=50)
    start = time.perf_counter()
    trainer.fit(model, loader, ckpt_path=ckpt)
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        accuracy = (model(x[TRAIN:]).argmax(1) == y[TRAIN:]).float().mean().item()
    return {
        "accuracy": accuracy,
        "seconds": seconds,
        "steps": trainer.global_step,
        "timeline": [(e["step"], e["frozen"]) for e in callback.controller.events] if freeze else [],
        "frozen": callback.frozen if freeze else 0,
        "weights": torch.cat([p.detach().flatten() for p in model.parameters()]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the runs' results here")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2 (the run is resumed from its middle), got {args.epochs}")
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and fair on a shared machine
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, freeze in (("no freezing", False), ("FreezeCallback", True)):
            runs[name] = r = fit(freeze, args.epochs, args.seed, Path(tmp) / name.replace(" ", "_"))
            print(
                f"{name:>14}: held-out accuracy {r['accuracy']:.1%}, {r['seconds']:.1f} s for {r['steps']} steps, "
                f"freezes (step, blocks frozen): {r['timeline'] or 'none'}"
            )
        half = args.epochs // 2
        ckpt = next((Path(tmp) / "FreezeCallback").glob(f"epoch={half - 1}-*.ckpt"))
        resumed = fit(True, args.epochs, args.seed, Path(tmp) / "resumed", ckpt=str(ckpt))
        full = runs["FreezeCallback"]
        same = (
            resumed["timeline"] == full["timeline"]
            and resumed["frozen"] == full["frozen"]
            and torch.equal(resumed["weights"], full["weights"])
        )
        print(f"resumed from {ckpt.name}: {'the same' if same else 'NOT the same'} decisions and weights")
    if args.json is not None:
        out = {k: {n: v for n, v in r.items() if n != "weights"} for k, r in runs.items()}
        args.json.write_text(json.dumps({**out, "resume_exact": same}, indent=2) + "\n", encoding="utf-8")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
