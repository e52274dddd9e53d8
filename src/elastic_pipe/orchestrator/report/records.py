"""Metrics and events: one JSON object per line in a file, one human line on stderr, every field documented.

Three record kinds (field ``"kind"``), described field by field in docs/training.md:

* ``"epoch"`` (:class:`EpochMetrics`): throughput and where the step time went, per epoch;
* ``"transition"`` (:class:`TransitionEvent`): every change of layout, with the seconds it took;
* ``"resume"``: a run continued from a checkpoint (``epoch``, ``step``, ``config_changes``); the records of what it
  does again are dropped first (:meth:`.event_log.EventLog.rewind`), so no epoch appears twice.

A run's summary (:class:`RunResult`) collects both, with the per-step losses and the final evaluation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PHASES", "EpochMetrics", "RunResult", "TransitionEvent"]

#: The phases a training step is split into, in order (seconds per step, slowest rank).
PHASES = ("data", "forward", "backward", "grad_sync", "optimizer")


@dataclass(frozen=True)
class EpochMetrics:
    """What one epoch did.

    Attributes:
        epoch: epoch index (0-based).
        steps: optimizer steps in the epoch.
        samples: training samples processed (``steps * global_batch``, less for a short last step).
        dropped: training samples the epoch left out (``[data] drop_last``, or the fewer than
            ``replicas x microbatches`` that a short last step cannot split evenly; 0 for an unfinished epoch).
        seconds: wall time of the epoch's training steps (evaluation and transitions excluded).
        samples_per_s: ``samples / seconds``.
        loss: mean training loss over the epoch's steps (mean over replicas and micro-batches).
        eval_loss: mean loss on the held-out split after the epoch (``None`` when ``[log] eval_every`` skipped it).
        eval_accuracy: accuracy on the held-out split after the epoch (classification only; else ``None``).
        data_s: seconds per step spent assembling the batch (indexing, copy to the device), slowest rank. On a
            GPU the five phase times are means over the steps timed (every ``timing_interval``-th step), whose
            phase edges synchronise the device; ``seconds`` covers every step.
        forward_s: seconds per step in forward compute: the frozen prefix (or cache read) plus the stage's forward.
        backward_s: seconds per step in the rest of the pipeline step: backward compute, activation and gradient
            transfers between stages, and pipeline bubbles.
        grad_sync_s: seconds per step averaging gradients over the stage's replica group.
        optimizer_s: seconds per step in the optimizer and learning-rate scheduler.
        grad_sync_ops: all-reduce operations the rank issued for gradient averaging in the epoch.
        grad_sync_ops_per_s: ``grad_sync_ops / seconds``.
        first_step_s: seconds of the epoch's first step (slowest rank), which carries a new layout's warm-up and,
            with ``[train] compile``, any compilation.
        pipe_len: pipeline length K during the epoch.
        replicas: data-parallel replicas during the epoch.
        frozen_units: frozen units (blocks) during the epoch.
        frozen_sublayers: frozen leading sub-layers during the epoch.
        microbatches: micro-batches per step and replica.
        cache: whether stage 0 read the frozen prefix's output from the activation cache.
        lr: learning rate at the end of the epoch.
        cuda_graph: whether the epoch's full steps replayed a CUDA graph (``[train] cuda_graphs``).
        graph_reason: why they did not (empty when they did).
        capture_s: seconds spent capturing the layout's graph during the epoch (its first epoch only).
        compile_s: seconds ``torch.compile`` spent compiling inside the epoch's steps, as torch measured them
            (``[train] compile``; a new layout's first epoch carries any recompilation).
        cache_hits: samples whose prefix output stage 0 read from the cache (summed over stage-0 ranks).
        cache_misses: samples whose prefix output stage 0 looked up and recomputed (not cached, or failed).
        cache_corrupt: disk-tier entries that failed their crc32 check: recomputed, never used (also misses).
        cache_view: the cached augmented view the epoch read (``[pipeline] cache_policy = "views"``); -1 otherwise.
        eval_s: seconds of the evaluation after the epoch on this rank (0 when none ran; not in ``seconds``).
    """

    epoch: int
    steps: int
    samples: int
    dropped: int
    seconds: float
    samples_per_s: float
    loss: float
    eval_loss: float | None
    eval_accuracy: float | None
    data_s: float
    forward_s: float
    backward_s: float
    grad_sync_s: float
    optimizer_s: float
    grad_sync_ops: int
    grad_sync_ops_per_s: float
    first_step_s: float
    pipe_len: int
    replicas: int
    frozen_units: int
    frozen_sublayers: int
    microbatches: int
    cache: bool
    lr: float
    cuda_graph: bool = False
    graph_reason: str = ""
    capture_s: float = 0.0
    compile_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_corrupt: int = 0
    cache_view: int = -1
    eval_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """The record as plain data (with ``"kind": "epoch"``)."""
        return {"kind": "epoch", **dataclasses.asdict(self)}

    def human(self, epochs: int) -> str:
        """One line for people: ``epoch 3/8 loss ... acc ... | K=2 R=2 frozen 3 | 812 samples/s | step ...``."""
        acc = "" if self.eval_accuracy is None else f" acc {self.eval_accuracy:.3f}"
        evl = "-" if self.eval_loss is None else f"{self.eval_loss:.4f}"
        ms = self.seconds / max(self.steps, 1) * 1e3
        split = " ".join(f"{p} {getattr(self, p + '_s') * 1e3:.1f}" for p in PHASES)
        return (
            f"epoch {self.epoch + 1}/{epochs} loss {self.loss:.4f} eval {evl}{acc} | "
            f"K={self.pipe_len} R={self.replicas} frozen {self.frozen_units} | {self.samples_per_s:.0f} samples/s | "
            f"step {ms:.1f} ms ({split} ms) | sync {self.grad_sync_ops_per_s:.1f} ops/s"
        )


@dataclass(frozen=True)
class TransitionEvent:
    """One change of layout.

    Attributes:
        epoch: the epoch that starts with the new layout, or (``epoch_step > 0``) the epoch it happened in.
        step: global optimizer steps completed before it.
        frozen_units: frozen units after it.
        frozen: frozen leading sub-layers after it.
        pipe_len: pipeline length after it.
        replicas: replicas after it.
        microbatches: micro-batches per step and replica after it.
        boundaries: ``pipe_len * virtual + 1`` sub-layer offsets of the new partition.
        changed_ranks: ranks whose (replica, stage) role changed.
        bytes_moved: bytes of weights, buffers and optimizer state the ranks received, summed over the job.
        cache: whether stage 0 reads the frozen prefix from the activation cache after it.
        seconds: wall time from the decision to the first step of the new layout (stats gathering, decision,
            broadcast, state moves, freezing, rebuilding the stage), measured on rank 0.
        phases: ``seconds`` split: ``decide`` (statistics, probe drift, policy, compression, message broadcast),
            ``moves`` (weights and optimizer state to new owners), ``freeze`` (the new prefix leaves the
            optimizer, modes), ``runner`` (the new pipeline stage and schedule), ``probe`` (a probe-driven
            policy's new baseline), ``cache`` (carrying cached activations to the new boundary, or filling them,
            timing the cache against recomputation), ``eval_store`` (the evaluation split's prefix outputs kept
            while the prefix is released), ``prefix`` (releasing or restoring the prefix's weights). The run's
            result adds ``compile`` and ``capture`` once the layout's first epoch ran: the compilation and CUDA
            graph capture its first steps paid (seconds on rank 0).
        epoch_step: steps of ``epoch`` completed before it: 0 at an epoch's start, more for a transition inside the
            epoch (``[freeze] decide_every``).
        prefix_released_bytes: device bytes of frozen-prefix weights the stage-0 ranks do without after it, because
            the activation cache serves the prefix completely, summed over the job (0: the prefix is resident).
        cache_entries: training entries rank 0's activation cache holds at the new boundary (carried or filled).
        cache_bytes: their bytes as stored.
        virtual: stages per rank after it (``[pipeline] virtual``, or the layout rule's choice under ``"auto"``).
    """

    epoch: int
    step: int
    frozen_units: int
    frozen: int
    pipe_len: int
    replicas: int
    microbatches: int
    boundaries: tuple[int, ...]
    changed_ranks: tuple[int, ...]
    bytes_moved: int
    cache: bool
    seconds: float
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    epoch_step: int = 0
    prefix_released_bytes: int = 0
    cache_entries: int = 0
    cache_bytes: int = 0
    virtual: int = 1

    def to_dict(self) -> dict[str, object]:
        """The record as plain data (with ``"kind": "transition"``)."""
        d = dataclasses.asdict(self)
        d["boundaries"] = list(self.boundaries)
        d["changed_ranks"] = list(self.changed_ranks)
        return {"kind": "transition", **d}

    def human(self) -> str:
        """One line for people."""
        where = (
            f"in epoch {self.epoch + 1} after step {self.epoch_step} (step {self.step} of the run)"
            if self.epoch_step
            else f"before epoch {self.epoch + 1}"
        )
        return (
            f"transition {where}: frozen {self.frozen_units} units, K={self.pipe_len} "
            f"R={self.replicas}, boundaries {list(self.boundaries)}, {self.bytes_moved / 1e6:.2f} MB moved, "
            f"cache {'on' if self.cache else 'off'}, {self.seconds:.3f} s"
        )


@dataclass
class RunResult:
    """What a run reports when it ends (rank 0 holds the full picture; other ranks the same numbers).

    Attributes:
        epochs: per-epoch metrics records.
        transitions: transition event records.
        losses: the global training loss of every optimizer step, in order.
        final_accuracy: evaluation accuracy after the last epoch (``None`` for non-classification).
        final_eval_loss: evaluation loss after the last epoch.
        seconds: wall time of the whole run on this rank.
        setup_s: of which the set-up before the first step: process groups, the model's sub-layers, the data
            splits, the activation cache, the initial layout (or the checkpoint's) and its stage.
        close_phases: seconds the trainer's ``close()`` took to release each part (after ``fit()``, not in
            ``seconds``): ``stage``, ``cache``, ``loaders`` (their worker processes), ``log``, ``groups`` (the
            process groups it created), ``process_group`` (the default group, when it joined it); empty before.
    """

    epochs: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    final_accuracy: float | None = None
    final_eval_loss: float = math.nan
    seconds: float = 0.0
    setup_s: float = 0.0
    close_phases: dict[str, float] = field(default_factory=dict)

    def last_evaluation(self) -> dict[str, Any] | None:
        """The record of the latest epoch that evaluated (``None`` before the first evaluation)."""
        return next((e for e in reversed(self.epochs) if e["eval_loss"] is not None), None)

    def history(self) -> dict[str, object]:
        """The records so far (what a checkpoint keeps)."""
        return {"epochs": self.epochs, "transitions": self.transitions, "losses": self.losses}

    def load_history(self, history: dict[str, Any]) -> None:
        """Continue from :meth:`history`."""
        self.epochs = list(history["epochs"])
        self.transitions = list(history["transitions"])
        self.losses = [float(v) for v in history["losses"]]

    def to_dict(self) -> dict[str, object]:
        """Plain data."""
        return {
            "epochs": self.epochs,
            "transitions": self.transitions,
            "losses": self.losses,
            "final_accuracy": self.final_accuracy,
            "final_eval_loss": self.final_eval_loss,
            "seconds": self.seconds,
            "setup_s": self.setup_s,
            "close_phases": self.close_phases,
        }
