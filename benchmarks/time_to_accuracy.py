"""Time to accuracy: full fine-tuning (eager and compiled), HF peft LoRA and elastic_pipe's freeze policies on the
same runs (issue #41).

Run: ``python benchmarks/time_to_accuracy.py --task bbc`` (or ``--task digits``; ``--tiny`` for a CPU smoke test of
every arm; ``--task custom --model mod:attr --data mod:attr --eval-data mod:attr`` for any model and dataset).
Writes a results JSON (``--out``) and a plot of held-out accuracy against wall seconds (``--plot``).
docs/time_to_accuracy.md describes the tasks, the arms and the commands.

Every arm of a task starts from the same checkpoint (one model, copied), reads the same training samples in the same
order (:class:`elastic_pipe.data.ElasticSampler` with the run's seed, whole batches only, as the trainer reads them),
under the same optimizer (AdamW, linear warm-up over the first 10% of the steps, then cosine decay to 0: the
trainer's own ``lr_lambda``), and is evaluated on the same held-out set after every epoch. Seeds (default 0, 1, 2)
change the data order and dropout. Arms:

* ``eager``, ``compiled``: a plain PyTorch loop, full fine-tuning, the model as is or ``torch.compile``d;
* ``lora-qkv-r8``, ``lora-all-r16``: the same loop over HF peft LoRA adapters (``inject_adapter_in_model``):
  rank 8 on the attention's input projection (this package's blocks fuse query, key and value into one ``qkv``
  linear layer, so the adapter spans all three), rank 16 on every linear layer of the blocks; the head trains fully;
  ``--lora-lr`` (compiled on CUDA unless ``--lora-eager``; ``--tune-lora-lr`` picks the rate on seed 0 first);
* ``elastic-none``, ``elastic-default``, ``elastic-alpha``, ``elastic-freezeout``: ``ElasticTrainer.fit()`` on one
  process, as a user runs it: without freezing, the default policy (the config's ``[freeze]`` left out),
  ``alpha = 1/3`` and FreezeOut (its default ``t0``, four decision points per epoch).

Per arm: the final held-out accuracy (mean and spread over seeds), the wall time to the target accuracy (the mean
final accuracy of ``elastic-none`` less 0.5 points, read at every evaluation) and the total wall time. Every clock
starts before the model moves to the device and stops after the last evaluation: compilation, the trainer's
set-up, cache fills, transitions and evaluations are all inside. The wall time at an evaluation of an elastic arm
leaves out only a transition made after it (it serves the steps that follow).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import itertools
import json
import math
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from elastic_pipe import data as edata
from elastic_pipe import models
from elastic_pipe.models.sublayer import SubLayerModel
from elastic_pipe.orchestrator import ElasticTrainer, TrainConfig, config_from_tables
from elastic_pipe.orchestrator.launch import join_process_group
from elastic_pipe.orchestrator.optim import lr_lambda

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_freeze_accuracy as study  # the accuracy study: its corpus split, MNIST-5k pre-training and warm-up

from _compile_pool import warm_compile_pool  # benchmarks/gpu (on the path since the study's import)
from _report import provenance
from _traced_trainer import TracedTrainer, slowest

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: The target: the reference arm's mean final accuracy less this margin (0.5 points).
MARGIN = 0.005
REFERENCE_ARM = "elastic-none"
#: The arm the speed-ups are quoted against.
BASELINE_ARM = "compiled"
PLAIN_ARMS = {"eager": False, "compiled": True}  # name -> torch.compile
#: LoRA arms: name -> (rank, the linear layers it adapts, by the last part of their module name).
LORA_ARMS = {"lora-qkv-r8": (8, ("qkv",)), "lora-all-r16": (16, ("qkv", "proj", "fc1", "fc2"))}
#: Elastic arms: name -> the config's ``[freeze]`` table (``None``: a decision point four times per epoch).
ELASTIC_ARMS: dict[str, dict[str, Any]] = {
    "elastic-none": {"policy": "never"},
    "elastic-default": {},
    "elastic-alpha": {"policy": "alpha", "options": {"alpha": 1 / 3}},
    "elastic-freezeout": {"policy": "freezeout", "decide_every": None},
}
ARMS = [*PLAIN_ARMS, *LORA_ARMS, *ELASTIC_ARMS]
#: ``--tune-lora-lr`` without values: these multiples of the task's full fine-tuning rate.
LORA_LR_FACTORS = (2.0, 5.0, 10.0, 20.0, 50.0)
#: A tuning whose best rate is the largest it tried goes on up by this factor, at most this many times.
LORA_LR_STEP, LORA_LR_STEPS_BEYOND = 2.5, 3
#: The random crop's padding of the digits task, in pixels per side at 224 px (4 at CIFAR's 32 px, scaled).
CROP_PAD = 28
EVAL_BATCH = 256
#: torchrun's environment for one process (``--standalone``), where the benchmark was started without it (and a
#: free port for ``MASTER_PORT``).
SINGLE_RANK = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def log(msg: str) -> None:
    print(f"[time-to-accuracy {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------ data
class TensorSet(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """``(input, label)`` pairs held in memory; with ``pad > 0`` a random crop (of the image padded by ``pad``
    pixels with its edge values) and a random horizontal flip per read, declared as ``random_augmentation``."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, pad: int = 0) -> None:
        self.inputs, self.targets, self.pad = inputs, labels, pad
        self.random_augmentation = pad > 0

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.inputs[i]
        if self.pad:
            p = self.pad
            side_h, side_w = x.shape[-2:]
            top, left = torch.randint(0, 2 * p + 1, (2,)).tolist()
            x = F.pad(x.unsqueeze(0), (p, p, p, p), mode="replicate")[0, :, top : top + side_h, left : left + side_w]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
        return x, int(self.targets[i])


@dataclass(frozen=True)
class Task:
    """One fine-tuning task: the checkpoint (``build`` returns a fresh copy), the data and the optimizer's numbers."""

    name: str
    description: str
    model_name: str  # the config's ``[model] name`` (the model object itself is passed to the trainer)
    build: Callable[[], SubLayerModel]
    train: torch.utils.data.Dataset[Any]
    eval: torch.utils.data.Dataset[Any]
    epochs: int
    batch: int
    lr: float
    weight_decay: float = 0.01
    loss: Loss | None = None  # None: cross-entropy
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train) // self.batch  # type: ignore[arg-type]

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs


def copies(model: SubLayerModel) -> Callable[[], SubLayerModel]:
    """A factory of independent copies of ``model`` (every arm's checkpoint)."""
    return lambda: copy.deepcopy(model)


def bbc_task(args: argparse.Namespace) -> Task:
    """The pretrained MiniLM-L6 on BBC News at ``--seq`` word pieces, the corpus's fixed 80/20 split (the test part
    is the held-out set); ``--max-docs`` keeps that many training articles (every class: they are sorted by class)."""
    corpus = edata.load_bbcnews()
    train_idx, test_idx = corpus.split()
    if args.max_docs:
        train_idx = train_idx[:: max(1, len(train_idx) // args.max_docs)][: args.max_docs]
        test_idx = test_idx[:: max(1, len(test_idx) // max(1, args.max_docs // 2))][: max(1, args.max_docs // 2)]
    x_train, y_train = study.bbc_tokens(corpus, train_idx, args.seq, args.minilm_dir)
    x_test, y_test = study.bbc_tokens(corpus, test_idx, args.seq, args.minilm_dir)
    base = models.load_minilm(num_classes=corpus.num_classes, seed=0, directory=args.minilm_dir)
    return Task(
        "bbc",
        f"pretrained all-MiniLM-L6-v2 + new 5-way head, BBC News, {args.seq} word pieces, fixed 80/20 split "
        f"({len(y_train)} training, {len(y_test)} held-out articles)",
        "minilm",
        copies(base),
        TensorSet(x_train, y_train),
        TensorSet(x_test, y_test),
        epochs=args.epochs or 6,
        batch=args.batch or 32,
        lr=args.lr or 5e-5,
        extra={"max_tokens": args.seq},
    )


def digits_task(args: argparse.Namespace, device: torch.device, autocast: bool) -> Task:
    """ViT-B/16 at 224 px pre-trained on MNIST-5k (the accuracy study's pre-training, upscaled), fine-tuned on the
    digits upscaled to 224 px with a random crop and flip; ``--tiny``: vit-tiny at 8 px on a few samples."""
    if args.tiny:
        preset: dict[str, Any] = {"config": "vit-tiny"}
        side, pad = 8, 1
    else:
        preset = {"config": "vit-b16", "in_channels": 1, "num_classes": 10}
        side, pad = 224, CROP_PAD
    state = study.pretrained_vit(preset, args.tiny, device, args.vit_checkpoint, autocast, side)
    base = models.vit(**preset)
    base.load_state_dict(state)
    digits = edata.load_digits()
    x, y = study.standardised_images(digits, side), digits.labels
    train_l, test_l = study.digits_split(len(digits))
    if args.tiny:
        train_l, test_l = train_l[:256], test_l[:96]
    pretrain = study.PRETRAIN_ACCURACY[0]
    pretrained = "?" if pretrain is None else f"{pretrain:.4f}"
    return Task(
        "digits",
        f"ViT ({preset['config']}) pre-trained on MNIST-5k at {side} px (held-out accuracy {pretrained}), fine-tuned "
        f"on scikit-learn's digits at {side}x{side} px with a random crop (padding {pad} px) and horizontal flip, "
        "fixed 80/20 split",
        "vit",
        copies(base),
        TensorSet(x[train_l], y[train_l], pad=pad),
        TensorSet(x[test_l], y[test_l]),
        epochs=args.epochs or (2 if args.tiny else 10),
        batch=args.batch or (32 if args.tiny else 64),
        lr=args.lr or (1e-3 if args.tiny else 1e-4),
        extra={"image_size": side, "crop_pad": pad, "pretrain_accuracy": pretrain},
    )


def imported(path: str) -> Any:
    """The attribute ``module:attr`` names."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise SystemExit(f"expected module:attr, got {path!r}")
    return getattr(importlib.import_module(module), attr)


def custom_task(args: argparse.Namespace) -> Task:
    """Any model and data by import path: ``--model`` (a callable returning a SubLayerModel), ``--data`` and
    ``--eval-data`` (callables returning map-style datasets of ``(input, label)``), ``--loss`` optional."""
    if not (args.model and args.data and args.eval_data):
        raise SystemExit("--task custom needs --model, --data and --eval-data (module:attr each)")
    base = imported(args.model)()
    if not isinstance(base, SubLayerModel):
        raise SystemExit(f"--model {args.model}: expected a SubLayerModel, got {type(base).__name__}")
    return Task(
        "custom",
        f"{args.model} on {args.data} (held out: {args.eval_data})",
        args.model,
        copies(base),
        imported(args.data)(),
        imported(args.eval_data)(),
        epochs=args.epochs or 3,
        batch=args.batch or 32,
        lr=args.lr or 5e-5,
        loss=imported(args.loss) if args.loss else None,
    )


# ------------------------------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class Setting:
    """What every arm of a job shares besides the task."""

    device: torch.device
    autocast: bool
    workers: int
    elastic_compile: str
    compile_lora: bool
    cache_policy: str
    views: int
    cache_mb: int
    #: Print ``torch.profiler``'s top operators of each elastic arm's N slowest transitions (0: none; the profiler
    #: slows what it watches, so such a job's times are not results).
    trace_transitions: int = 0
    #: The elastic arms' ``[train] cuda_graphs`` ("auto": the trainer's default).
    elastic_graphs: str = "auto"


def task_config(task: Task, setting: Setting, seed: int, freeze: Mapping[str, Any] | None = None) -> TrainConfig:
    """The trainer's config of ``task`` (the plain loops read its optimizer numbers and schedule too)."""
    tables: dict[str, Any] = {
        "model": {"name": task.model_name},
        "data": {"workers": setting.workers},
        "train": {
            "epochs": task.epochs,
            "global_batch": task.batch,
            "optimizer": "adamw",
            "lr": task.lr,
            "weight_decay": task.weight_decay,
            "lr_schedule": "cosine",
            "warmup_steps": max(1, round(0.1 * task.total_steps)),
            "seed": seed,
            "autocast": "bf16" if setting.autocast else "none",
            "compile": setting.elastic_compile,
            "cuda_graphs": setting.elastic_graphs,
        },
        "pipeline": {"cache_policy": setting.cache_policy, "views": setting.views, "cache_mb": setting.cache_mb},
        "launch": {"nproc_per_node": 1},
        "log": {"progress": False},
    }
    if freeze:
        table = dict(freeze)
        if "decide_every" in table and table["decide_every"] is None:
            table["decide_every"] = max(1, task.steps_per_epoch // 4)
        tables["freeze"] = table
    return config_from_tables(tables)


class EpochBatches:
    """The trainer's order of the training samples: an :class:`~elastic_pipe.data.ElasticSampler` with the run's
    seed, whole global batches only; ``set_epoch`` before each epoch's pass."""

    def __init__(self, n: int, batch: int, seed: int) -> None:
        self.sampler = edata.ElasticSampler(n, 1, 0, seed=seed, shuffle=True, drop_last=False)
        self.batch, self.steps = batch, n // batch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            ids = self.sampler.step_indices(self.batch)
            self.sampler.advance(self.batch)
            yield ids


@torch.no_grad()
def accuracy(model: nn.Module, data: torch.utils.data.Dataset[Any], setting: Setting) -> float:
    """The share of ``data``'s labels the argmax of ``model``'s output matches (eval mode)."""
    model.eval()
    correct = count = 0
    for x, y in torch.utils.data.DataLoader(data, batch_size=EVAL_BATCH):
        with torch.autocast(setting.device.type, torch.bfloat16, enabled=setting.autocast):
            out = model(x.to(setting.device, non_blocking=True))
        correct += int((out.argmax(-1) == y.to(setting.device)).sum())
        count += y.numel()
    model.train()
    return correct / count


def add_lora(model: SubLayerModel, rank: int, targets: Sequence[str]) -> SubLayerModel:
    """HF peft LoRA adapters (rank ``rank``, alpha ``2 * rank``) on the blocks' linear layers named ``targets``;
    only the adapters and the head train."""
    from peft import LoraConfig, inject_adapter_in_model

    head = model.slice(model.head_start(), model.num_sublayers)
    in_head = {id(m) for m in head.modules()}
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in targets and id(m) not in in_head
    ]
    if not names:
        raise SystemExit(f"LoRA: the model has no linear layer named {', '.join(targets)} outside its head")
    model = inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=names), model)
    for p in head.parameters():
        p.requires_grad_(True)
    return model


def plain_run(
    task: Task, model: nn.Module, setting: Setting, seed: int, *, compiled: bool, lr: float | None = None
) -> dict[str, Any]:
    """A plain PyTorch loop over ``model``'s trainable parameters; ``lr`` replaces the task's rate."""
    t0 = time.perf_counter()
    config = task_config(task, setting, seed)
    torch.manual_seed(seed)
    device = setting.device
    model = model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=lr or task.lr, weight_decay=task.weight_decay, fused=device.type == "cuda" or None
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config.train, task.total_steps))
    forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compiled else model  # type: ignore[assignment]
    order = EpochBatches(len(task.train), task.batch, seed)  # type: ignore[arg-type]
    loader = torch.utils.data.DataLoader(
        task.train,
        batch_sampler=order,
        num_workers=setting.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=setting.workers > 0,
    )
    loss_fn = task.loss or F.cross_entropy
    curve: list[list[float]] = []
    for epoch in range(task.epochs):
        order.set_epoch(epoch)
        for x, y in loader:
            with torch.autocast(device.type, torch.bfloat16, enabled=setting.autocast):
                out = forward(x.to(device, non_blocking=True))
            loss = loss_fn(out.float(), y.to(device, non_blocking=True))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        curve.append([time.perf_counter() - t0, accuracy(model, task.eval, setting)])
    # the loader's persistent workers shut down inside the total, as the elastic arms' trainer closes its loaders
    del loader
    return {"curve": curve, "accuracy": curve[-1][1], "total_seconds": time.perf_counter() - t0, "lr": lr or task.lr}


def elastic_run(
    task: Task, model: SubLayerModel, setting: Setting, seed: int, freeze: dict[str, Any]
) -> dict[str, Any]:
    """``ElasticTrainer.fit()`` with the arm's ``[freeze]`` table; the accuracy after every epoch and its time."""
    t0 = time.perf_counter()
    config = task_config(task, setting, seed, freeze)
    curve: list[list[float]] = []

    def on_epoch_end(trainer: ElasticTrainer) -> None:
        now = time.perf_counter() - t0
        record = trainer.result.epochs[-1]
        after = sum(  # the transition made after this evaluation serves the next epoch
            t["seconds"]
            for t in trainer.result.transitions
            if t["epoch"] == record["epoch"] + 1 and t.get("epoch_step", 0) == 0
        )
        acc = record["eval_accuracy"]
        curve.append([now - after, math.nan if acc is None else float(acc)])

    kind = TracedTrainer if setting.trace_transitions else ElasticTrainer
    with kind(config, model=model, data=task.train, eval_data=task.eval, loss=task.loss, quiet=True) as t:
        result = t.fit(on_epoch_end=on_epoch_end)
        traces = getattr(t, "traces", [])
    total = time.perf_counter() - t0
    if traces:
        log(
            f"seed {seed}: the {setting.trace_transitions} slowest transitions\n"
            + slowest(traces, setting.trace_transitions)
        )
    return {
        "curve": curve,
        "accuracy": result.final_accuracy,
        "total_seconds": total,
        "setup_seconds": result.setup_s,
        # what the trainer's close (counted in total_seconds) took per part: loaders, groups, cache, ...
        "close_phases": result.close_phases,
        "frozen_timeline": [[e["step"], e["frozen_units"]] for e in result.transitions],
        "transition_seconds": sum(e["seconds"] for e in result.transitions),
        # where each transition's time went (decide, moves, cache, eval_store, runner, compile, capture, ...)
        "transition_phases": [e.get("phases", {}) for e in result.transitions],
        "cache_by_epoch": [e.get("cache") for e in result.epochs],
        "compile_seconds": sum(e.get("compile_s", 0.0) for e in result.epochs),
        # where each epoch's time went: its steps' parts, the first step, compile, capture, the evaluation
        "epoch_parts": [{k: e[k] for k in EPOCH_PARTS if k in e} for e in result.epochs],
    }


#: The epoch record's fields an elastic arm's report keeps per epoch (seconds, and what explains them).
EPOCH_PARTS = (
    "seconds",
    "steps",
    "first_step_s",
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "compile_s",
    "capture_s",
    "eval_s",
    "cuda_graph",
    "cache_hits",
    "cache_misses",
    "frozen_sublayers",
)


def variant_arm(spec: str) -> tuple[str, dict[str, Any]]:
    """``--policy-arm``'s ``policy:key=value,...`` (the accuracy study's arm grammar) as an elastic arm's name and
    ``[freeze]`` table: ``"drift:max_fraction=0.95"`` is the arm ``elastic-drift:max_fraction=0.95``."""
    try:
        parsed = study.registered_arm(spec)
    except ValueError as exc:
        raise SystemExit(f"--policy-arm: {exc}") from None
    return f"elastic-{spec}", {"policy": parsed.policy, "options": dict(parsed.options)}


def run_arm(task: Task, arm: str, setting: Setting, seed: int, lora_lr: Mapping[str, float]) -> dict[str, Any]:
    """One arm of ``task`` for ``seed``, from a fresh copy of the checkpoint, with the compiler's state reset."""
    torch._dynamo.reset()
    gc.collect()
    if setting.device.type == "cuda":
        torch.cuda.empty_cache()
    model = task.build()
    if arm in PLAIN_ARMS:
        return plain_run(task, model, setting, seed, compiled=PLAIN_ARMS[arm])
    if arm in LORA_ARMS:
        rank, targets = LORA_ARMS[arm]
        lora = add_lora(model, rank, targets)
        return plain_run(task, lora, setting, seed, compiled=setting.compile_lora, lr=lora_lr[arm])
    table = ELASTIC_ARMS[arm] if arm in ELASTIC_ARMS else variant_arm(arm.removeprefix("elastic-"))[1]
    return elastic_run(task, model, setting, seed, table)


def tune_lora(task: Task, arms: Sequence[str], setting: Setting, grid: Sequence[float]) -> dict[str, Any]:
    """Each LoRA arm on seed 0 at every rate of ``grid``, and above it while the largest rate tried is the best
    (:func:`rates_beyond`); the rate of the best final accuracy (the lower on a tie)."""
    out: dict[str, Any] = {}
    for arm in arms:
        tried: dict[float, float] = {}
        rates = sorted(grid)
        while rates:
            for lr in rates:
                r = run_arm(task, arm, setting, 0, {arm: lr})
                tried[lr] = r["accuracy"]
                log(f"{task.name} {arm} lr {lr:g}: accuracy {r['accuracy']:.4f} ({r['total_seconds']:.1f} s)")
            rates = rates_beyond(tried, grid)
        out[arm] = {"accuracy_by_lr": {repr(lr): acc for lr, acc in sorted(tried.items())}, "chosen": best_rate(tried)}
    return out


def rates_beyond(tried: Mapping[float, float], grid: Sequence[float]) -> list[float]:
    """The next rate to try above the grid: the largest rate tried times :data:`LORA_LR_STEP` when that largest rate
    has the best accuracy (strictly: a tie goes to the lower rate, so the search stops) and fewer than
    :data:`LORA_LR_STEPS_BEYOND` rates above ``grid`` were tried; else none. A best rate at the grid's edge would
    leave LoRA's rate untuned on that side."""
    top = max(tried)
    beyond = sum(lr > max(grid) for lr in tried)
    return [top * LORA_LR_STEP] if best_rate(tried) == top and beyond < LORA_LR_STEPS_BEYOND else []


def best_rate(tried: Mapping[float, float]) -> float:
    """The rate of the best accuracy in ``tried`` (rate -> accuracy), the lower rate on a tie."""
    return max(sorted(tried), key=lambda lr: tried[lr])


# ------------------------------------------------------------------------------------------------------ summary
def time_to_target(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The wall seconds of the first evaluation in ``curve`` (``[seconds, accuracy]`` pairs, in order) at or above
    ``target``; ``None`` when none reaches it."""
    for seconds, acc in curve:
        if acc >= target - 1e-12:
            return float(seconds)
    return None


def _spread(values: Sequence[float]) -> float:
    return max(values) - min(values)


def summarise(
    runs: Mapping[str, Mapping[str, Mapping[str, Any]]],
    reference: str = REFERENCE_ARM,
    baseline: str = BASELINE_ARM,
    margin: float = MARGIN,
) -> dict[str, Any]:
    """Per arm (``runs[arm][seed]`` each a run with ``curve``, ``accuracy`` and ``total_seconds``): the accuracy's
    mean, spread and standard deviation; the time to the target (``reference``'s mean final accuracy less
    ``margin``) by seed, its mean when every seed reached it; the total time; both as speed-ups over ``baseline``.
    """
    target = statistics.fmean(r["accuracy"] for r in runs[reference].values()) - margin if reference in runs else None
    arms: dict[str, Any] = {}
    for arm, by_seed in runs.items():
        acc = [r["accuracy"] for r in by_seed.values()]
        total = [r["total_seconds"] for r in by_seed.values()]
        tta = {s: time_to_target(r["curve"], target) if target is not None else None for s, r in by_seed.items()}
        reached = [v for v in tta.values() if v is not None]
        arms[arm] = {
            "accuracy_mean": statistics.fmean(acc),
            "accuracy_spread": _spread(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "accuracy_by_seed": {s: r["accuracy"] for s, r in by_seed.items()},
            "total_seconds_mean": statistics.fmean(total),
            "total_seconds_by_seed": {s: r["total_seconds"] for s, r in by_seed.items()},
            "time_to_target_by_seed": tta,
            "reached": f"{len(reached)}/{len(tta)}",
            "time_to_target_mean": statistics.fmean(reached) if reached and len(reached) == len(tta) else None,
        }
    base = arms.get(baseline, {})
    for a in arms.values():
        if target is not None:
            a["accuracy_vs_reference_points"] = 100 * (a["accuracy_mean"] - (target + margin))
        a[f"time_to_target_speedup_vs_{baseline}"] = _ratio(base.get("time_to_target_mean"), a["time_to_target_mean"])
        a[f"total_speedup_vs_{baseline}"] = _ratio(base.get("total_seconds_mean"), a["total_seconds_mean"])
    return {"reference_arm": reference, "baseline_arm": baseline, "margin": margin, "target": target, "arms": arms}


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """One report from partial ones of the same task (say one per seed, run in separate jobs): the runs joined and
    summarised again."""
    parts = [json.loads(p.read_text()) for p in paths]
    keys = ("commit", "dirty", "device", "torch", "seeds", "compile_pool_s", "first_compile_s")
    summary = [{k: part[k] for k in keys if k in part} for part in parts]  # before the first part becomes the whole
    report: dict[str, Any] = parts[0]
    for part in parts[1:]:
        for arm, by_seed in part["runs"].items():
            report["runs"].setdefault(arm, {}).update(by_seed)
    report["seeds"] = sorted({s for part in parts for s in part["seeds"]})
    report["parts"] = summary
    report.update(summarise(report["runs"]))
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    """Held-out accuracy against wall seconds, one line per arm and seed, the target dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.get_cmap("tab10")
    for i, (arm, by_seed) in enumerate(report["runs"].items()):
        for k, run in enumerate(by_seed.values()):
            secs, accs = zip(*run["curve"], strict=True)
            ls = "-" if arm.startswith("elastic") else "--"
            ax.plot(secs, [100 * a for a in accs], ls, marker="o", ms=3, color=colours(i % 10),
                    label=arm if k == 0 else None, alpha=0.8)  # fmt: skip
    if report.get("target") is not None:
        ax.axhline(100 * report["target"], color="grey", ls=":", lw=1, label="target")
    ax.set_xlabel("wall seconds (everything counted)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"{report['task']}: {report['description'][:90]}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(report: dict[str, Any]) -> str:
    """A Markdown table of the report's arms."""
    speed = f"time_to_target_speedup_vs_{report['baseline_arm']}"
    lines = [
        f"{report['task']}: target {100 * report['target']:.2f}%" if report["target"] is not None else report["task"],
        "",
        "| arm | accuracy (mean) | spread | to target (s) | reached | total (s) | speed-up to target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arm, a in report["arms"].items():
        tta, sp = a["time_to_target_mean"], a[speed]
        lines.append(
            f"| {arm} | {100 * a['accuracy_mean']:.2f}% | {100 * a['accuracy_spread']:.2f} | "
            f"{'-' if tta is None else f'{tta:.1f}'} | {a['reached']} | {a['total_seconds_mean']:.1f} | "
            f"{'-' if sp is None else f'{sp:.2f}x'} |"
        )
    return "\n".join(lines)


#: The arm :func:`paired_table` compares every other arm with: the plain eager loop, full fine-tuning as a user
#: would write it (the target's reference, ``elastic-none``, is the trainer without freezing).
PAIRED_AGAINST = "eager"


def paired(report: dict[str, Any], arm: str, against: str = PAIRED_AGAINST) -> dict[str, Any] | None:
    """``arm``'s final held-out accuracy against ``against``'s on the same seeds, in points: the per-seed
    differences, their mean and the 95% interval of the mean (Student's t over the seeds; ``None`` with one seed).
    ``None`` when the two arms share no seed."""
    runs, base = report["runs"].get(arm, {}), report["runs"].get(against, {})
    seeds = sorted(set(runs) & set(base), key=int)
    if not seeds:
        return None
    diffs = [100 * (runs[s]["accuracy"] - base[s]["accuracy"]) for s in seeds]
    mean = statistics.fmean(diffs)
    interval = None
    if len(diffs) > 1:
        half = float(stats.t.ppf(0.975, len(diffs) - 1)) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        interval = [mean - half, mean + half]
    return {"seeds": seeds, "diffs": diffs, "mean": mean, "interval": interval}


def paired_table(report: dict[str, Any], against: str = PAIRED_AGAINST) -> str:
    """A Markdown table of every other arm's final accuracy against ``against``'s, seed by seed (:func:`paired`); empty
    when the report has no ``against`` arm."""
    if against not in report["runs"]:
        return ""
    lines = [
        f"| arm | vs {against} (points, mean) | per seed | 95% interval |",
        "| --- | ---: | --- | --- |",
    ]
    for arm in report["runs"]:
        p = None if arm == against else paired(report, arm, against)
        if p is None:
            continue
        seeds = ", ".join(f"{d:+.2f}" for d in p["diffs"])
        low_high = "-" if p["interval"] is None else "{:+.2f} to {:+.2f}".format(*p["interval"])
        lines.append(f"| {arm} | {p['mean']:+.2f} | {seeds} | {low_high} |")
    return "\n".join(lines)


def epoch_table(report: dict[str, Any]) -> str:
    """A Markdown table of every arm's and seed's seconds per epoch: the time from one evaluation to the next, so the
    first holds the arm's set-up and compilation, and a transition made at an epoch's end counts in the epoch it
    serves; beside them the total and the freezes (step: frozen units) of an elastic arm."""
    lines = [
        "| arm | seed | seconds per epoch | total (s) | freezes (step: units) |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for arm, by_seed in report["runs"].items():
        for seed, run in sorted(by_seed.items()):
            ends = [seconds for seconds, _ in run["curve"]]
            epochs = ", ".join(f"{b - a:.2f}" for a, b in itertools.pairwise([0.0, *ends]))
            freezes = ", ".join(f"{step}: {units}" for step, units in run.get("frozen_timeline", [])) or "-"
            lines.append(f"| {arm} | {seed} | {epochs} | {run['total_seconds']:.2f} | {freezes} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--task", choices=("bbc", "digits", "custom"), default="bbc")
    ap.add_argument("--tiny", action="store_true", help="digits: vit-tiny at 8 px on a few samples (a smoke test)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"a comma-separated subset of {', '.join(ARMS)}")
    ap.add_argument(
        "--policy-arm",
        action="append",
        default=[],
        metavar="SPEC",
        help="an elastic arm more, policy:key=value,... (e.g. drift:max_fraction=0.95); repeatable",
    )
    ap.add_argument("--epochs", type=int, default=0, help="default: bbc 6, digits 10, custom 3")
    ap.add_argument("--batch", type=int, default=0, help="default: bbc 32, digits 64, custom 32")
    ap.add_argument("--lr", type=float, default=0.0, help="full fine-tuning's rate (default: bbc 5e-5, digits 1e-4)")
    ap.add_argument("--lora-lr", type=float, default=0.0, help="the LoRA arms' rate (default: 10x --lr)")
    ap.add_argument(
        "--tune-lora-lr",
        nargs="?",
        const="",
        default=None,
        help="first run each LoRA arm on seed 0 at these rates (comma-separated; default: 2, 5, 10, 20, 50x --lr) and "
        "use the best one's",
    )
    ap.add_argument("--lora-lr-from", type=Path, default=None, help="the LoRA rates (and tuning) of a report")
    ap.add_argument("--lora-eager", action="store_true", help="LoRA arms not compiled (default: compiled on CUDA)")
    ap.add_argument("--seq", type=int, default=256, help="bbc: word pieces per article")
    ap.add_argument("--max-docs", type=int, default=0, help="bbc: training articles kept (0: all; a smoke test)")
    ap.add_argument("--minilm-dir", default=None, help="MiniLM files (default: $ELASTIC_PIPE_MINILM_DIR or bundled)")
    ap.add_argument("--vit-checkpoint", type=Path, default=None, help="digits: share the pre-training via a file")
    ap.add_argument("--model", default="", help="custom: module:attr of a callable returning a SubLayerModel")
    ap.add_argument("--data", default="", help="custom: module:attr of a callable returning the training dataset")
    ap.add_argument("--eval-data", default="", help="custom: module:attr of a callable returning the held-out set")
    ap.add_argument("--loss", default="", help="custom: module:attr of loss(output, target) (default cross-entropy)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (every arm)")
    ap.add_argument("--elastic-compile", choices=("auto", "on", "off"), default="auto", help="[train] compile")
    ap.add_argument("--elastic-graphs", choices=("auto", "on", "off"), default="auto", help="[train] cuda_graphs")
    ap.add_argument(
        "--compile-pool",
        choices=("first", "lazy"),
        default="first",
        help="Inductor's compile workers and the process's first compilation: before the first arm (default), or "
        "paid by the first arm that compiles",
    )
    ap.add_argument("--cache-policy", choices=("bypass", "views"), default="views", help="augmented data's cache")
    ap.add_argument("--views", type=int, default=2, help="cached views per sample with --cache-policy views")
    ap.add_argument("--cache-mb", type=int, default=16384, help="[pipeline] cache_mb")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--autocast", choices=("auto", "bf16", "none"), default="auto", help="bf16 on CUDA by default")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/time_to_accuracy_TASK.json")
    ap.add_argument("--plot", type=Path, default=None, help="default: beside --out, .png")
    ap.add_argument("--merge", type=Path, nargs="*", default=None, help="merge partial reports of one task")
    ap.add_argument(
        "--trace-transitions",
        type=int,
        default=0,
        metavar="N",
        help="print torch.profiler's top operators of each elastic arm's N slowest transitions (times not results)",
    )
    ap.add_argument("--epochs-of", type=Path, default=None, help="print a report's seconds per epoch, then stop")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.epochs_of is not None:  # reading a report: nothing is measured or written
        print(epoch_table(json.loads(args.epochs_of.read_text())))
        return 0
    out = args.out or study.ROOT / "benchmarks" / "results" / f"time_to_accuracy_{args.task}.json"
    plot_path = args.plot or out.with_suffix(".png")
    if args.merge:
        report = merge(args.merge)
    elif "elastic" in args.arms:
        # the trainer joins a process group from torchrun's environment; a plain `python` run is one rank
        for key, value in SINGLE_RANK.items():
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        report = measure(args)
    else:
        report = measure(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, plot_path)
    print(table(report))
    if paired_rows := paired_table(report):
        print("\nFinal accuracy against the plain eager loop, seed by seed:\n" + paired_rows)
    log(f"wrote {out} and {plot_path}")
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every arm and seed of the task ``args`` names (seed by seed, each seed's arms in turn: a machine that speeds
    up or slows down meets every arm alike)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = [variant_arm(spec)[0] for spec in args.policy_arm]
    arms = [a for a in args.arms.split(",") if a] + variants
    elastic = [a for a in arms if a in ELASTIC_ARMS] + variants
    unknown = sorted(set(arms) - set(ARMS) - set(variants))
    if unknown:
        raise SystemExit(f"--arms: unknown {', '.join(unknown)}; expected some of {', '.join(ARMS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    autocast = args.autocast == "bf16" or (args.autocast == "auto" and device.type == "cuda")
    setting = Setting(
        device=device,
        autocast=autocast,
        workers=args.workers,
        elastic_compile=args.elastic_compile,
        elastic_graphs=args.elastic_graphs,
        compile_lora=device.type == "cuda" and not args.lora_eager,
        cache_policy=args.cache_policy,
        views=args.views if args.cache_policy == "views" else 1,
        cache_mb=args.cache_mb,
        trace_transitions=args.trace_transitions,
    )
    task = {"bbc": bbc_task, "custom": custom_task}.get(args.task, lambda a: digits_task(a, device, autocast))(args)
    log(f"{task.name}: {task.description}; {task.steps_per_epoch} steps/epoch x {task.epochs} epochs")
    lora_arms = [a for a in arms if a in LORA_ARMS]
    lora_lr = dict.fromkeys(lora_arms, args.lora_lr or 10 * task.lr)
    # one process group for every elastic run (the trainer leaves a group it did not create alone)
    joined = join_process_group(task_config(task, setting, 0)) if elastic else False
    try:
        x0 = torch.stack([task.train[i][0] for i in range(task.batch)])
        study.warm_up(task.build(), x0, device, autocast)  # lazy initialisation, clocks: before any timed run
        # Inductor's compile workers and the process's first compilation: paid here, so that no arm's time holds them
        pool = warm_compile_pool(start=device.type == "cuda" and args.compile_pool == "first")
        tuning = None
        if args.lora_lr_from is not None:  # a previous job's choice (say, the seed-0 job that tuned it)
            chosen = json.loads(args.lora_lr_from.read_text())
            lora_lr = {a: chosen["lora_lr"][a] for a in lora_arms}
            tuning = chosen["lora_lr_tuning"]
        elif args.tune_lora_lr is not None and lora_arms:
            grid = [float(v) for v in args.tune_lora_lr.split(",") if v] or [f * task.lr for f in LORA_LR_FACTORS]
            tuning = tune_lora(task, lora_arms, setting, grid)
            lora_lr = {a: tuning[a]["chosen"] for a in lora_arms}
        runs: dict[str, dict[str, Any]] = {a: {} for a in arms}
        for seed in seeds:
            for arm in arms:
                r = run_arm(task, arm, setting, seed, lora_lr)
                runs[arm][str(seed)] = r
                log(f"{task.name} {arm:18s} seed {seed}: accuracy {r['accuracy']:.4f} total {r['total_seconds']:.1f} s")
    finally:
        if joined:
            torch.distributed.destroy_process_group()
    return {
        **provenance(),
        "command": "python benchmarks/time_to_accuracy.py " + " ".join(sys.argv[1:]),
        "task": task.name,
        "description": task.description,
        "seeds": seeds,
        "train_samples": len(task.train),  # type: ignore[arg-type]
        "eval_samples": len(task.eval),  # type: ignore[arg-type]
        "epochs": task.epochs,
        "batch": task.batch,
        "steps_per_epoch": task.steps_per_epoch,
        "lr": task.lr,
        "weight_decay": task.weight_decay,
        "warmup_fraction": 0.1,
        "evaluations": "after every epoch, every arm",
        "lora_lr": lora_lr,
        "lora_lr_tuning": tuning,
        "lora_compiled": setting.compile_lora,
        "autocast": "bf16" if autocast else "none",
        "workers": setting.workers,
        "elastic_compile": setting.elastic_compile,
        "elastic_graphs": setting.elastic_graphs,
        "trace_transitions": setting.trace_transitions,
        **pool,
        "cache_policy": setting.cache_policy if getattr(task.train, "random_augmentation", False) else "exact",
        "views": setting.views,
        **task.extra,
        "runs": runs,
        **summarise(runs),
    }


if __name__ == "__main__":
    raise SystemExit(main())
