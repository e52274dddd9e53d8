"""One rank's stage in one layout: the stage module and its runner, gradient tracking and sync, the frozen prefix.

A :class:`StageRuntime` is built from a layout and thrown away at the next transition; nothing in it outlives its
layout except the activation cache it is handed (which carries entries from one boundary to the next).

Frozen prefix. Only stage-0 ranks run the frozen prefix (under ``no_grad``, in eval mode) on their own
micro-batches, or read its output from the activation cache when that pays, and feed the result to stage 0.
This keeps every rank busy (no rank is set aside to serve the prefix) and costs no transfer per step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import cache as acache
from elastic_pipe import freeze
from elastic_pipe.orchestrator.context import RunContext
from elastic_pipe.orchestrator.cuda_graph import GraphChoice, decide_graph
from elastic_pipe.orchestrator.forward_graphs import ForwardGraphs
from elastic_pipe.orchestrator.grad_sync import OverlappedAverager, average_gradients
from elastic_pipe.orchestrator.prefix_cache import BYPASS_REASON, FillPeers, prepare_cache, widening
from elastic_pipe.orchestrator.prefix_reads import PrefetchedBatches, complete, counters, epoch_counts, read_prefix
from elastic_pipe.orchestrator.prefix_residency import KEPT_REASON, carry, settle
from elastic_pipe.orchestrator.stage import build_runner, unit_modules
from elastic_pipe.orchestrator.step_data import Batch, DatasetSplit
from elastic_pipe.orchestrator.timing import ForwardTimer, PhaseClock
from elastic_pipe.types import Layout

__all__ = ["StageRuntime"]


def _widen(t: torch.Tensor, rows: int, requires_grad: bool) -> torch.Tensor:
    """``t``'s first row repeated ``rows`` times (contiguous: torch allocates its receive buffers like it)."""
    return t.detach()[:1].expand(rows, *t.shape[1:]).contiguous().requires_grad_(requires_grad)


class StageRuntime:
    """This rank's stage of ``layout``: what a step runs.

    Args:
        ctx: the rank's fixed facts.
        layout: the layout the stage belongs to.
    """

    def __init__(self, ctx: RunContext, layout: Layout) -> None:
        self.ctx = ctx
        self.layout = layout
        plan = ctx.plan(layout)
        self.stage = int(plan.stage_of(ctx.rank))
        self.replica = int(plan.replica_of(ctx.rank))
        self.owned = ctx.owned(layout)
        s = self.stage
        lo, hi = layout.boundaries[s], layout.boundaries[s + 1]
        sublayers = ctx.sublayers
        self.module = nn.Sequential(*ctx.stage_sublayers(lo, hi))
        self.module.train()
        self._bounds = (lo, hi)
        #: The micro-batch size of a full step; a short last step has a runner of its own (declared shapes).
        self.rows = ctx.config.train.global_batch // layout.replicas // layout.microbatches
        self._runners: dict[int, Any] = {}
        #: Whether each step size's runner replays a CUDA graph, and why not (``[train] cuda_graphs``).
        self.graph_choices: dict[int, GraphChoice] = {}
        self.runner: Any = self.runner_for(self.rows)
        self.forward_timer = ForwardTimer(self.module, ctx.device)
        # only the units the policy can still freeze: frozen ones are outside the stage, those past the policy's
        # cap (freeze.signal_layers) are never read
        watched = freeze.signal_layers(ctx.parts.policy)
        tracked = unit_modules(sublayers, ctx.unit_ends, lo, hi) if ctx.track_gradients else {}
        self.tracker = freeze.GradNormTracker({u: m for u, m in tracked.items() if u < watched})
        #: The probe outputs of the units this rank holds, for a probe-driven policy (:mod:`.probe`); else None.
        self.drift = freeze.OutputDrift() if freeze.needs_probe(ctx.parts.policy) else None
        #: The probe's forwards, replayed as CUDA graphs once captured (:mod:`.forward_graphs`); with the drift.
        self.probe_graphs = (
            ForwardGraphs(ctx.device, autocast_dtype=ctx.autocast_dtype, enabled=ctx.config.train.cuda_graphs != "off")
            if self.drift is not None
            else None
        )
        self.averager: OverlappedAverager | None = None
        if layout.replicas > 1 and layout.microbatches == 1:
            # With one micro-batch and several replicas, gradients are averaged while the backward pass runs.
            params = [p for j in self.owned for p in sublayers[j].parameters() if p.requires_grad]
            self.averager = OverlappedAverager(params, group=self._dp_group(), replicas=layout.replicas)
        self.cache: acache.ActivationCache | None = None
        self.cache_on = False
        self.cache_reason = "off"
        self._ahead: PrefetchedBatches | None = None
        #: Whether the cache holds every training sample's entry at the boundary (steps then load no inputs).
        self.cache_complete = False
        #: Entries this rank's cache holds at the boundary after :meth:`setup_cache`, and their bytes as stored.
        self.cache_entries = self.cache_bytes = 0
        #: Whether steps store the prefix outputs they compute (the cache is not read here: :meth:`_fills_in_steps`).
        self.fills_in_steps = False
        #: Device bytes of frozen-prefix weights the job's stage-0 ranks do without in this layout (released).
        self.prefix_released_bytes = 0
        self._counted = (0, 0, 0)
        self._positions: dict[int, int] | None = None  # sample id -> position, for _read_inputs

    @property
    def is_first(self) -> bool:
        """Whether this rank runs stage 0 (and so the frozen prefix)."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """Whether this rank runs the last stage (and so the loss)."""
        return self.stage == self.layout.pipe_len - 1

    def _dp_group(self) -> dist.ProcessGroup:
        group: dist.ProcessGroup = self.ctx.groups.dp_group(self.layout.pipe_len)
        return group

    def runner_for(self, rows: int) -> Any:
        """The schedule runner of micro-batches of ``rows`` samples (built at first use; a collective then, in the
        replica's pipeline, when torch infers the shapes)."""
        runner = self._runners.get(rows)
        if runner is None:
            ctx, layout = self.ctx, self.layout
            lo, hi = self._bounds
            choice = self.graph_choices[rows] = decide_graph(
                ctx.config.train.cuda_graphs,
                device_type=ctx.device.type,
                pipe_len=layout.pipe_len,
                microbatches=layout.microbatches,
                replicas=layout.replicas,
                rows=rows,
                full_rows=self.rows,
            )
            runner = self._runners[rows] = build_runner(
                self.module,
                stage=self.stage,
                pipe_len=layout.pipe_len,
                microbatches=layout.microbatches,
                schedule=ctx.parts.schedule,
                device=ctx.device,
                group=ctx.groups.pipeline_group(layout.pipe_len),
                examples=lambda: self._example_io(lo, hi, rows),
                loss_fn=ctx.parts.loss,
                compiled=ctx.compiled is not None,
                # a stage at the model's input never receives a gradient-carrying one, in any layout
                grad_input=ctx.compiled is not None and lo > 0,
                graph=choice.use,
                graph_always=ctx.config.train.cuda_graphs == "on",
            )
        return runner

    def _example_io(self, lo: int, hi: int, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Example micro-batch tensors of ``mb`` rows at the stage's input and output.

        They come from the boundary examples taken at setup (:attr:`RunContext.examples`): a stage declares
        shapes and dtypes, which need none of the sub-layers before it, so a rank that holds only its stage can
        declare them. A stage after the first receives an activation that needs a gradient; the metadata must say
        so, or the stage computes no input gradient and the stages before it train on zeros.
        """
        x, y = self.ctx.examples[lo], self.ctx.examples[hi]
        return _widen(x, mb, lo > 0 and x.is_floating_point()), _widen(y, mb, False)

    # ------------------------------------------------------------------------------------------------ the cache
    def setup_cache(
        self, cache: acache.ActivationCache | None, old_frozen: int, *, clock: PhaseClock | None = None
    ) -> None:
        """On stage-0 ranks: carry cached entries to the new boundary, then decide whether reading pays; then, on
        every rank (a collective), release the frozen prefix where the cache serves it
        (:func:`.prefix_residency.settle`; the bytes it saves go to :attr:`prefix_released_bytes`).

        Args:
            clock: a transition's clock: the carry or fill laps ``cache``, then :func:`.prefix_residency.settle`
                laps ``eval_store`` and ``prefix``.
        """
        self._prepare_cache(cache, old_frozen)
        self.cache_entries, self.cache_bytes = self._held_at_boundary()
        if clock is not None:
            clock.lap("cache")
        serving = self.cache if self.is_first and self.cache_on else None
        self.prefix_released_bytes = settle(self.ctx, self.layout, first=self.is_first, serving=serving, clock=clock)

    def _held_at_boundary(self) -> tuple[int, int]:
        """Entries this rank's cache holds at the layout's boundary (every tier) and their bytes as stored."""
        cache, frozen = self.cache, self.layout.frozen
        if cache is None or not self.cache_on or frozen == 0:
            return 0, 0
        entries = int(cache.cached(self.ctx.train_set.sample_ids.to("cpu", torch.int64), frozen).sum())
        example = self.ctx.prefix_example(frozen)
        return entries, entries * example[0].numel() * cache.stored_dtype(example.dtype).itemsize

    def _prepare_cache(self, cache: acache.ActivationCache | None, old_frozen: int) -> None:
        ctx, layout = self.ctx, self.layout
        self.cache = cache
        self.cache_on = self.cache_complete = False
        if cache is None or layout.frozen == 0 or not self.is_first:
            self.cache_reason = "off" if cache is None else "nothing to cache here"
            return
        if not cache.enabled:  # random transforms, bypassed: the prefix runs on each step's augmented input
            self.cache_reason = BYPASS_REASON
            return
        per_replica = ctx.config.train.global_batch // layout.replicas
        peers = None
        if layout.replicas > 1:
            group = self._dp_group()
            peers = FillPeers(group, dist.get_rank(group), layout.replicas)
        if ctx.prefix.released and carry(ctx, layout, cache, old_frozen, chunk=per_replica, peers=peers):
            self.cache_on, self.cache_reason = True, KEPT_REASON  # only the newly frozen sub-layers ran
            self.cache_reason += self._stored_as(cache)
            self.cache_complete = complete(cache, ctx.train_set, layout.frozen)
            return
        # With "auto" a rank alone fills a boundary it has nothing to carry to by its steps, not by a pass over the
        # split first: the pass would read every input once more (through the loader) for one epoch of reads.
        in_steps = (
            peers is None
            and ctx.config.pipeline.cache == "auto"
            and old_frozen not in cache.boundaries()
            and self._fills_in_steps(cache)
        )
        self.cache_on, self.cache_reason = prepare_cache(
            cache,
            ctx.train_set,
            mode=ctx.config.pipeline.cache,
            old_frozen=old_frozen,
            frozen=layout.frozen,
            per_replica=per_replica,
            # A replica's batch per forward: the shapes the training step's prefix forward already ran (kernels
            # chosen, memory known to fit); larger chunks measured slower on the first fill (2x H200).
            chunk=per_replica,
            device=ctx.device,
            run=widening(ctx.run_sublayers, lambda lo: ctx.prefix_example(lo).dtype),
            peers=peers,
            example=ctx.prefix_example(layout.frozen),
            fill=not in_steps,
        )
        self.cache_reason += self._stored_as(cache)
        self.cache_complete = self.cache_on and complete(cache, ctx.train_set, layout.frozen)
        self.fills_in_steps = not self.cache_on and self._fills_in_steps(cache)

    def _stored_as(self, cache: acache.ActivationCache) -> str:
        """What the cache reason adds when ``[pipeline] cache_dtype`` stores the entries narrower than the prefix
        outputs (their bytes are the stored dtype's), ``""`` when they are stored as they are."""
        example = self.ctx.prefix_example(self.layout.frozen)
        stored = cache.stored_dtype(example.dtype)
        if stored == example.dtype:
            return ""
        name, entry = str(stored).removeprefix("torch."), example[0].numel() * stored.itemsize
        return f"; entries stored as {name} ({entry} bytes each), read as {str(example.dtype).removeprefix('torch.')}"

    def _fills_in_steps(self, cache: acache.ActivationCache) -> bool:
        """Whether this layout's steps may store the frozen prefix's outputs they compute: those they compute anyway
        when the cache is not read at this boundary (reading did not pay, ``cache = "auto"``), or, for a rank
        alone with ``"auto"``, a first fill by the steps' misses instead of a pass over the split.

        A later transition then carries them through the newly frozen sub-layers only
        (:meth:`~elastic_pipe.cache.ActivationCache.extend`) and its fill reads and runs only what is still
        missing, instead of a pass over the whole training split through the loader (on one H200, ViT-B/16 and
        47,500 images from a file: the pass took 39 s and the epoch after it 11 s; filled by its steps, that epoch
        took 36 s). Only where every entry fits in the device and host tiers (so no put is ever refused; a disk
        write checksums every row, on the host) and with one view per sample.
        """
        if cache.config.views_per_sample != 1:
            return False
        example = self.ctx.prefix_example(self.layout.frozen)
        spread = cache.placement(self.layout.frozen, tuple(example.shape[1:]), example.dtype, len(self.ctx.train_set))
        return spread.get("disk", 0) == 0 and spread["none"] == 0

    @property
    def needs_inputs(self) -> bool:
        """Whether a step loads its inputs: stage 0 does, unless the cache holds every sample's prefix output."""
        return self.is_first and not self.cache_complete

    # ------------------------------------------------------------------------------------------------ an epoch
    def begin_epoch(self, epoch: int, *, since: StageRuntime | None = None) -> None:
        """Select the epoch's cached view (``epoch % views``) and start the epoch's cache counters, or, for a stage
        that replaces ``since`` inside the epoch (a mid-epoch transition), go on from where it counted."""
        if self.cache is not None:
            self.cache.set_epoch(epoch)
        if since is not None and since.cache_on and self.cache_on:
            self._counted = since._counted
        else:
            self._counted = counters(self.cache if self.cache_on else None)

    def read_ahead(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """The epoch's batches, each step's cache lookup started one step ahead when stage 0 reads the cache."""
        self._ahead = None
        if self.cache_on and self.cache is not None:
            self._ahead = PrefetchedBatches(batches, self.cache, self.layout.frozen, self.ctx.host_ids)
            return self._ahead
        return batches

    def cache_view(self, epoch: int) -> int:
        """The augmented view epoch ``epoch`` reads when the cache keeps several (-1: no views read)."""
        views = self.cache.config.views_per_sample if self.cache is not None else 1
        return epoch % views if self.cache_on and views > 1 else -1

    def end_epoch(self) -> dict[str, int]:
        """The epoch's cache counters summed over the ranks (a collective; see ``prefix_reads.epoch_counts``)."""
        self._ahead = None
        return epoch_counts(self._counted, self.cache if self.cache_on else None, self.ctx.device)

    # ------------------------------------------------------------------------------------------------- a step
    def frozen_prefix(self, x: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
        """The frozen prefix's output on ``x`` (from the cache when it is on, through the lookup started a step
        ahead when there is one). ``x`` is ``None`` when the step loaded no inputs (:attr:`needs_inputs`)."""
        frozen = self.layout.frozen
        if frozen == 0 or (x is None and not self.cache_complete):
            return x
        if self.cache_on and self.cache is not None:
            lookup = self._ahead.take(ids) if self._ahead is not None else None
            return read_prefix(
                self.cache,
                lookup,
                ids,
                x,
                frozen=frozen,
                run_prefix=lambda v: self.ctx.run_sublayers(v, 0, frozen),
                read_inputs=self._read_inputs,
                dtype=self.ctx.prefix_example(frozen).dtype,  # the hits as the stage after the prefix takes them
            )
        assert x is not None
        out = self.ctx.run_sublayers(x, 0, frozen)
        if self.fills_in_steps and self.cache is not None:
            self.cache.put(ids, frozen, out)
        return out

    def _read_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        """The inputs of the samples ``ids`` (what a step that loaded none reads for its lookup's misses)."""
        data = self.ctx.train_set
        if isinstance(data, DatasetSplit):
            return data.inputs_of(ids.tolist())
        # samples held in memory (a Split): their rows, found by id (a miss of a complete cache is rare: an entry
        # that failed its crc32), so the id -> position map is built at the first one
        if self._positions is None:
            self._positions = {int(v): j for j, v in enumerate(self.ctx.host_ids.tolist())}
        rows = torch.tensor([self._positions[int(v)] for v in ids.tolist()], dtype=torch.long)
        inputs = data.input_rows(0, len(data))
        return inputs[rows.to(inputs.device)]

    def run(
        self, x: torch.Tensor | None, y: torch.Tensor | None, losses: list[torch.Tensor], *, rows: int | None = None
    ) -> None:
        """One pipelined forward and backward of this stage (a collective in the replica's pipeline).

        Args:
            rows: samples per micro-batch (a short last step has fewer); ``None``: a full step's.
        """
        runner = self.runner if rows is None or rows == self.rows else self.runner_for(rows)
        with self.ctx.autocast():
            if self.layout.pipe_len == 1:
                runner.step(x, target=y, losses=losses)
            elif self.is_first:
                runner.step(x)
            elif self.is_last:
                runner.step(target=y, losses=losses)
            else:
                runner.step()

    def grad_sync(self) -> int:
        """Average the stage's gradients over its replica group; returns the number of all-reduce calls."""
        replicas = self.layout.replicas
        if replicas == 1:
            return 0
        if self.averager is not None:
            return self.averager.finish()
        sublayers = self.ctx.sublayers
        grads = [p.grad for j in self.owned for p in sublayers[j].parameters() if p.grad is not None]
        return average_gradients(grads, group=self._dp_group(), replicas=replicas)

    def close(self) -> None:
        """Take this stage's hooks off the model's parameters and modules. Idempotent."""
        if self.averager is not None:
            self.averager.remove()
            self.averager = None
        self.forward_timer.remove()
        self.runner = None
        self._runners.clear()
        self.drift = None
        self.probe_graphs = None
