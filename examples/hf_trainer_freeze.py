"""The default freeze policy in a Hugging Face ``Trainer``: one callback, no loop of your own.

What it shows:
  * ``FreezeCallback()`` added to an unchanged ``Trainer`` script: the drift policy (the default) with its probe,
    deciding four times per epoch, freezing the leading blocks of a ViT (``vit.layers`` / ``vit.encoder.layer``,
    found by the adapter; the embeddings freeze with the first block);
  * the decisions in ``trainer.state.log_history`` (and ``frozen_blocks`` in every log line);
  * the same run without the callback, for the accuracy and time side by side;
  * ``FreezeCallback(cache=True)``: the frozen blocks run once per sample, later steps start from their cached
    output; the dataset returns each sample's position under ``idx`` and ``remove_unused_columns=False`` keeps it
    (the callback takes it out of the model's arguments);
  * the callback's state beside each checkpoint (``elastic_pipe_freeze.json``), so that
    ``trainer.train(resume_from_checkpoint=True)`` resumes exactly.

A tiny ViT built from a config (no download), trained on the bundled 8x8 digits (the first 1,000 images; the rest
held out), on CPU. Run:  python examples/hf_trainer_freeze.py [--epochs 12] [--json out.json]   (under a minute)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

from elastic_pipe.data import load_digits
from elastic_pipe.integrations.transformers import FreezeCallback

TRAIN = 1000


class Digits(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, indexed: bool = False) -> None:
        self.x, self.y, self.indexed = x, y, indexed

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        sample = {"pixel_values": self.x[i], "labels": self.y[i]}
        return {**sample, "idx": torch.tensor(i)} if self.indexed else sample


def build(seed: int) -> ViTForImageClassification:
    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return ViTForImageClassification(config)


#: The arms: the callback's options, or None for no callback.
ARMS: dict[str, dict[str, Any] | None] = {
    "no freezing": None,
    "FreezeCallback()": {},
    "FreezeCallback(cache=True)": {"cache": True},
}


def train(options: dict[str, Any] | None, epochs: int, seed: int, out: Path) -> dict[str, Any]:
    digits = load_digits()
    x, y = digits.inputs, digits.labels
    model = build(seed)
    cached = bool(options and options.get("cache"))
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=50,
        num_train_epochs=epochs,
        learning_rate=4e-3,
        lr_scheduler_type="cosine",
        save_strategy="epoch",
        save_total_limit=1,
        logging_steps=20,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
        remove_unused_columns=not cached,  # keep idx for the cache
    )
    callbacks = [] if options is None else [FreezeCallback(**options)]
    data = Digits(x[:TRAIN], y[:TRAIN], indexed=cached)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        accuracy = (model(pixel_values=x[TRAIN:]).logits.argmax(1) == y[TRAIN:]).float().mean().item()
    timeline = [
        (e["step"], e["freeze/frozen_blocks"]) for e in trainer.state.log_history if "freeze/frozen_blocks" in e
    ]
    return {"accuracy": accuracy, "seconds": seconds, "steps": trainer.state.global_step, "timeline": timeline}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the runs' results here")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and fair on a shared machine
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, options) in enumerate(ARMS.items()):
            runs[name] = r = train(options, args.epochs, args.seed, Path(tmp) / f"arm{i}")
            print(
                f"{name:>26}: held-out accuracy {r['accuracy']:.1%}, {r['seconds']:.1f} s for {r['steps']} steps, "
                f"freezes (step, blocks frozen): {r['timeline'] or 'none'}"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
