"""The frozen prefix of a run, one :class:`FrozenPrefix` per rank: the activation cache, whether the prefix's weights
are released, the evaluation outputs kept while they are, and whether stage 0 reads the cache (the payoff).

Only stage-0 ranks run the frozen prefix (under ``no_grad``, in eval mode) on their own micro-batches, or read its
output from the activation cache when that pays, and feed the result to stage 0. This keeps every rank busy (no
rank is set aside to serve the prefix) and costs no transfer per step.

Entering a layout (:meth:`FrozenPrefix.enter`) carries the cached entries to the new boundary, decides whether
reading pays and fills the cache, then releases the prefix's weights where the cache serves it
(:mod:`.residency`); during an epoch :meth:`FrozenPrefix.batches` starts each step's lookup a step ahead and
:meth:`FrozenPrefix.forward` turns a batch into stage 0's input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from elastic_pipe.orchestrator.data import Batch, DatasetSplit
from elastic_pipe.orchestrator.prefix.build import build_cache, release_cache
from elastic_pipe.orchestrator.prefix.carry import CacheJob, FillPeers, cache_runner, widening
from elastic_pipe.orchestrator.prefix.fill import (
    BYPASS_REASON,
    ReadsPaid,
    in_steps,
    pass_idle,
    prepare_cache,
    stored_as,
)
from elastic_pipe.orchestrator.prefix.reads import PrefetchedBatches, counters, covers, epoch_counts, held, read_prefix
from elastic_pipe.orchestrator.prefix.residency import KEPT_REASON, carry, settle
from elastic_pipe.orchestrator.prefix.shared import all_peers
from elastic_pipe.orchestrator.prefix.state import PrefixState

if TYPE_CHECKING:
    from elastic_pipe import cache as acache
    from elastic_pipe.orchestrator.context import RunContext
    from elastic_pipe.orchestrator.report import PhaseClock
    from elastic_pipe.types import Layout

__all__ = ["FrozenPrefix", "PrefixReport"]


@dataclass(frozen=True)
class PrefixReport:
    """What entering a layout did to the frozen prefix (:meth:`FrozenPrefix.enter`).

    Attributes:
        cache: whether this rank's stage 0 reads the activation cache in the layout.
        reason: why it does or does not.
        released_bytes: device bytes of frozen-prefix weights the job's stage-0 ranks do without in the layout
            (summed over the job; 0 when the prefix is resident).
        cache_entries: training entries this rank's cache holds at the layout's boundary.
        cache_bytes: their bytes, as stored.
    """

    cache: bool = False
    reason: str = "off"
    released_bytes: int = 0
    cache_entries: int = 0
    cache_bytes: int = 0


class FrozenPrefix:
    """This rank's frozen prefix for the whole run (built once, after the run's context).

    Args:
        ctx: the rank's fixed facts.
        cache: the run's activation cache (``None``: ``[pipeline] cache = "off"``); closed by :meth:`close`.
    """

    def __init__(self, ctx: RunContext, cache: acache.ActivationCache | None) -> None:
        #: The rank's fixed facts.
        self.ctx = ctx
        #: The run's activation cache (``None`` when off).
        self.cache = cache
        self._state = PrefixState()
        #: The run's last measured payoff of reading the cache (``cache = "auto"``), reused at deeper boundaries.
        self.paid = ReadsPaid()
        self._layout: Layout | None = None
        self._first = False
        self._group: dist.ProcessGroup | None = None
        #: What the latest :meth:`enter` did.
        self.report = PrefixReport()
        #: Whether the cache holds every training sample's entry at the boundary (steps then load no inputs).
        self.cache_complete = False
        #: Whether steps store the prefix outputs they compute (the cache is not read here: :func:`.fill.in_steps`).
        self.fills_in_steps = False
        self._was_on = False
        self._ahead: PrefetchedBatches | None = None
        self._counted = (0, 0, 0)
        self._positions: dict[int, int] | None = None  # sample id -> position, for _read_inputs

    @classmethod
    def build(cls, ctx: RunContext) -> FrozenPrefix:
        """The run's frozen prefix with the cache ``[pipeline]`` describes (a collective on the control group)."""
        cache = build_cache(
            ctx.config,
            rank=ctx.rank,
            device=ctx.device,
            num_samples=int(ctx.host_ids.max()) + 1,
            random_transforms=bool(getattr(ctx.train_set, "random_augmentation", False)),
            broadcast=ctx.broadcast_bytes,
        )
        return cls(ctx, cache)

    # ------------------------------------------------------------------------------------------------- state
    @property
    def frozen(self) -> int:
        """The boundary of the layout entered last (0 before the first)."""
        return 0 if self._layout is None else self._layout.frozen

    @property
    def cache_on(self) -> bool:
        """Whether stage 0 reads the cache in the current layout."""
        return self.report.cache

    @property
    def released(self) -> int:
        """Leading sub-layers whose weights the stage-0 ranks released (0: resident); the same on every rank."""
        return self._state.released

    @property
    def eval_bytes(self) -> int:
        """Bytes of memory the kept evaluation outputs take on this rank."""
        return self._state.eval_bytes

    @property
    def needs_inputs(self) -> bool:
        """Whether a step loads its inputs: stage 0 does, unless the cache holds every sample's prefix output."""
        return self._first and not self.cache_complete

    def eval_input(self, positions: torch.Tensor) -> tuple[torch.Tensor, int]:
        """While the prefix is released, on a stage-0 rank: the kept outputs of the evaluation samples at
        ``positions`` (on the device) and the boundary they belong to (the previous one, right after a transition,
        until :meth:`enter` carries them on)."""
        return self._state.eval_rows(positions, self.ctx.device), self._state.eval_frozen

    def forget(self) -> None:
        """The prefix's weights were loaded again (a checkpoint's): resident, no evaluation outputs kept."""
        self._state.forget()

    # ------------------------------------------------------------------------------------------------ a layout
    def enter(
        self, layout: Layout, old_frozen: int, *, step: int | None = None, clock: PhaseClock | None = None
    ) -> PrefixReport:
        """Bring the prefix to ``layout`` (a collective): on stage-0 ranks carry the cached entries from
        ``old_frozen`` to the new boundary, then decide whether reading pays (filling when it does); then, on every
        rank, release the frozen prefix where the cache serves it (:func:`.residency.settle`).

        Args:
            step: the run's optimizer steps done (a first fill by a pass over the split is skipped when the rest of
                the run reads no more entries than it fills: :func:`.fill.pass_idle`); ``None``: not weighed.
            clock: a transition's clock: the carry or fill laps ``cache``, then :func:`.residency.settle` laps
                ``eval_store`` and ``prefix``.
        """
        ctx = self.ctx
        self._layout = layout
        self._first = int(ctx.plan(layout).stage_of(ctx.rank)) == 0
        self._group = ctx.groups.dp_group(layout.pipe_len) if layout.replicas > 1 else None
        self._was_on = self.report.cache
        on, reason = self._prepare(layout, old_frozen, step)
        entries, stored = 0, 0
        if self.cache is not None and on and layout.frozen > 0:
            entries, stored = held(self.cache, ctx.train_set, layout.frozen, ctx.prefix_example(layout.frozen))
        if clock is not None:
            clock.lap("cache")
        serving = self.cache if self._first and on else None
        freed = settle(ctx, layout, self._state, first=self._first, serving=serving, clock=clock)
        self.report = PrefixReport(on, reason, freed, entries, stored)
        return self.report

    def _prepare(self, layout: Layout, old_frozen: int, step: int | None) -> tuple[bool, str]:
        """Carry, judge and fill the cache for ``layout`` on a stage-0 rank; whether stage 0 reads it, and why."""
        ctx, cache = self.ctx, self.cache
        self.cache_complete = self.fills_in_steps = False
        if cache is None or layout.frozen == 0 or not self._first:
            return False, "off" if cache is None else "nothing to cache here"
        if not cache.enabled:  # random transforms, bypassed: the prefix runs on each step's augmented input
            return False, BYPASS_REASON
        per_replica = ctx.config.train.global_batch // layout.replicas
        peers = None
        if self._group is not None:
            peers = FillPeers(self._group, dist.get_rank(self._group), layout.replicas)
        example = ctx.prefix_example(layout.frozen)
        run = widening(ctx.run_sublayers, lambda lo: ctx.prefix_example(lo).dtype)
        job = CacheJob(
            cache,
            ctx.train_set,
            old_frozen,
            layout.frozen,
            # A replica's batch per forward: the shapes the training step's prefix forward already ran (kernels
            # chosen, memory known to fit); larger chunks measured slower on the first fill (2x H200).
            chunk=per_replica,
            device=ctx.device,
            run=cache_runner(run, per_replica, ctx.device),
            example=example,
        )
        if self._state.released and carry(ctx, layout, self._state, job, peers=peers):
            self.cache_complete = covers(cache, ctx.train_set, layout.frozen)
            return True, KEPT_REASON + stored_as(cache, example)  # only the newly frozen sub-layers ran
        # With "auto" a rank alone fills a boundary it has nothing to carry to by its steps, not by a pass over the
        # split first: the pass would read every input once more (through the loader) for one epoch of reads.
        mode, first_fill = ctx.config.pipeline.cache, old_frozen not in cache.boundaries()
        samples, frozen = len(ctx.train_set), layout.frozen
        steps_fill = peers is None and mode == "auto" and first_fill and in_steps(cache, frozen, example, samples)
        pass_due = mode == "auto" and first_fill and not steps_fill
        idle = pass_idle(ctx.epochs_left(step), cache.config.views_per_sample) if pass_due else ""
        if peers is not None and mode == "auto" and not all_peers(bool(idle), peers, ctx.device):
            idle = ""  # another peer holds entries to carry: the shared fill (a collective) runs on every peer
        if idle:  # the steps run the prefix (storing what they compute where they may)
            self.fills_in_steps = in_steps(cache, frozen, example, samples)
            return False, idle
        on, reason = prepare_cache(
            job, mode=mode, per_replica=per_replica, paid=self.paid, peers=peers, fill=not steps_fill
        )
        self.cache_complete = on and covers(cache, ctx.train_set, layout.frozen)
        self.fills_in_steps = not on and in_steps(cache, frozen, example, samples)
        return on, reason + stored_as(cache, example)

    # ------------------------------------------------------------------------------------------------ an epoch
    def begin_epoch(self, epoch: int, *, going_on: bool = False) -> None:
        """Select the epoch's cached view (``epoch % views``) and start the epoch's cache counters, or, inside an
        epoch after a transition (``going_on``), go on counting where the previous layout stopped when both read
        the cache."""
        if self.cache is not None:
            self.cache.set_epoch(epoch)
        if not (going_on and self._was_on and self.cache_on):
            self._counted = counters(self.cache if self.cache_on else None)

    def batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """The epoch's batches, each step's cache lookup started one step ahead when stage 0 reads the cache."""
        self._ahead = None
        if self.cache_on and self.cache is not None and self._layout is not None:
            self._ahead = PrefetchedBatches(batches, self.cache, self._layout.frozen, self.ctx.host_ids)
            return self._ahead
        return batches

    def cache_view(self, epoch: int) -> int:
        """The augmented view epoch ``epoch`` reads when the cache keeps several (-1: no views read)."""
        views = self.cache.config.views_per_sample if self.cache is not None else 1
        return epoch % views if self.cache_on and views > 1 else -1

    def end_epoch(self) -> dict[str, int]:
        """The epoch's cache counters summed over the ranks (a collective; see :func:`.reads.epoch_counts`)."""
        self._ahead = None
        return epoch_counts(self._counted, self.cache if self.cache_on else None, self.ctx.device)

    # ------------------------------------------------------------------------------------------------- a step
    def forward(self, x: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor | None:
        """The frozen prefix's output on ``x`` (from the cache when it is on, through the lookup started a step
        ahead when there is one). ``x`` is ``None`` when the step loaded no inputs (:attr:`needs_inputs`)."""
        assert self._layout is not None, "no layout entered"
        frozen = self._layout.frozen
        if frozen == 0 or (x is None and not self.cache_complete):
            return x
        ctx = self.ctx
        if self.cache_on and self.cache is not None:
            lookup = self._ahead.take(ids) if self._ahead is not None else None
            return read_prefix(
                self.cache,
                lookup,
                ids,
                x,
                frozen=frozen,
                run_prefix=lambda v: ctx.run_sublayers(v, 0, frozen),
                read_inputs=self._read_inputs,
                dtype=ctx.prefix_example(frozen).dtype,  # the hits as the stage after the prefix takes them
            )
        assert x is not None
        out = ctx.run_sublayers(x, 0, frozen)
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

    def close(self) -> None:
        """At the run's end: let the cache go (the node's leader deletes its shared files). Idempotent."""
        self._ahead = None
        if self.cache is not None:
            release_cache(self.cache)
            self.cache = None
