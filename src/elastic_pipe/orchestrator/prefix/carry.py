"""The one path by which cached entries reach a new boundary (:func:`carry_entries`), and what every fill shares:
the sub-layers' runner (:data:`RunSublayers`, widened to the dtype they expect: :func:`widening`, run at the
training step's batch size only: :func:`at_rows`), the peers that fill together (:class:`FillPeers`) and what
one boundary's cache work runs on (:class:`CacheJob`).

With ``[pipeline] cache_dtype`` narrower than the prefix output, the entries are stored (and all-gathered and
broadcast between peers) in the narrower dtype; sub-layers that run on cached entries take them widened back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from elastic_pipe import cache as acache
    from elastic_pipe.orchestrator.data import StepData

__all__: list[str] = []  # internal: the package face exports what others use

#: Runs sub-layers ``lo:hi`` on a batch (``run(x, lo, hi)``), under ``no_grad``.
RunSublayers = Callable[[torch.Tensor, int, int], torch.Tensor]


def widening(run: RunSublayers, dtype_at: Callable[[int], torch.dtype]) -> RunSublayers:
    """``run`` with its input cast to ``dtype_at(lo)`` first when it starts past the model's input (``lo > 0``).

    Sub-layers that carry cached entries to a new boundary (:meth:`~elastic_pipe.cache.ActivationCache.extend`)
    get them as stored, which ``[pipeline] cache_dtype`` may make narrower than the prefix output they expect
    (``dtype_at(lo)``: the dtype of the activation entering sub-layer ``lo``); a cast to the same dtype is free.
    """

    def run_widened(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        return run(x.to(dtype_at(lo)) if lo > 0 else x, lo, hi)

    return run_widened


def at_rows(run: RunSublayers, rows: int) -> RunSublayers:
    """``run`` on batches of exactly ``rows`` rows: a shorter batch is padded with copies of its last row, and the
    padding's outputs are dropped (rows are independent: the frozen prefix runs in eval mode). A longer batch runs
    as it is.

    On a GPU the first batch of a size a process has not run pays for that size's kernels: cuDNN's attention
    builds a plan per shape (one H100, MiniLM-L6 at 256 word pieces: the first forward at 17 rows took 58.6 ms,
    the same forward later a few; docs/benchmarks.md, "What a batch of a new size costs"). The cache's carry and
    fill run the training step's batch size, which the steps already ran; the last chunk of a pass is shorter,
    and its size changes with the number of entries, so unpadded it would cost a new plan at many transitions.
    """

    def run_padded(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        short = rows - int(x.shape[0])
        if short <= 0 or short == rows:  # as long as ``rows`` or longer, or empty (no row to copy)
            return run(x, lo, hi)
        padded = torch.cat([x, x[-1:].expand(short, *x.shape[1:])])
        return run(padded, lo, hi)[: x.shape[0]]

    return run_padded


def cache_runner(run: RunSublayers, rows: int, device: torch.device) -> RunSublayers:
    """The runner of a boundary's cache work on ``device``: :func:`at_rows` ``rows`` on a GPU, where a batch of a new
    size costs its own kernels; ``run`` itself elsewhere (on the CPU padding would only add rows)."""
    return at_rows(run, rows) if device.type == "cuda" else run


@dataclass(frozen=True)
class FillPeers:
    """The stage-0 ranks of every replica, which share one pass over the training split.

    Each computes every ``count``-th chunk of the prefix outputs and an all-gather in ``group`` hands every
    peer the rest, so the pass costs ``1/count`` of the compute it would cost each rank alone.

    Attributes:
        group: the process group of the peers (the stage-0 data-parallel group).
        index: this rank's position in ``group``.
        count: the number of peers.
    """

    group: dist.ProcessGroup
    index: int
    count: int


@dataclass(frozen=True)
class CacheJob:
    """What one boundary's cache work on a stage-0 rank runs on: the cache carried (or filled) from ``old_frozen``
    to ``frozen`` over the training split ``data``, ``chunk`` samples per forward of ``run`` on ``device``.

    Attributes:
        cache: the rank's activation cache.
        data: the training split.
        old_frozen: the cached boundary before the transition (0: none).
        frozen: the new boundary (number of frozen sub-layers, > 0).
        chunk: samples per prefix forward and per carry (a replica's batch: the shapes the training step already
            ran).
        device: where the inputs go.
        run: runs a range of sub-layers (:func:`cache_runner` of the :func:`widening` of the context's runner: on
            a GPU every forward of the cache's work runs at one batch size, ``chunk``).
        example: the prefix output at ``frozen`` for one sample (the entries' shape and dtype), if the caller
            has it; ``None``: whoever needs it runs the prefix on one sample.
    """

    cache: acache.ActivationCache
    data: StepData
    old_frozen: int
    frozen: int
    chunk: int
    device: torch.device
    run: RunSublayers
    example: torch.Tensor | None = None

    def carry(self, peers: FillPeers | None = None, only: torch.Tensor | None = None) -> None:
        """:func:`carry_entries` of this job's entries from ``old_frozen`` to ``frozen``."""
        carry_entries(self.cache, self.old_frozen, self.frozen, run=self.run, chunk=self.chunk, peers=peers, only=only)

    def shape_example(self) -> torch.Tensor:
        """:attr:`example`, or the prefix run on the split's first sample to learn the entries' shape and dtype."""
        if self.example is not None:
            return self.example
        return self.run(self.data.input_rows(0, 1).to(self.device), 0, self.frozen)


def carry_entries(
    cache: acache.ActivationCache,
    old_frozen: int,
    frozen: int,
    *,
    run: RunSublayers,
    chunk: int,
    peers: FillPeers | None = None,
    only: torch.Tensor | None = None,
) -> None:
    """The one path by which cached entries reach a new boundary: those this rank holds at ``old_frozen`` are
    carried to ``frozen`` in place by running only sub-layers ``old_frozen:frozen`` on them
    (:meth:`~elastic_pipe.cache.ActivationCache.extend`; the old boundary's memory goes to the new one).

    Args:
        chunk: entries per forward of ``run`` (a replica's batch: a size the training step already ran).
        peers: several replicas' stage-0 ranks that carry together (a collective in ``peers.group``: every peer
            calls it, one that holds nothing at ``old_frozen`` too). The carry then runs between two barriers,
            since ``extend`` is node-wide for node-shared tiers: every peer lets go of the old files before the
            leader rewrites them, and none reads the new ones before it is done.
        only: the sample ids whose entries this rank carries (a peer's share); the others' slots stay reserved
            for the rows another peer sends. ``None``: every entry held.
    """
    shared = peers is not None and peers.count > 1
    if shared:
        assert peers is not None
        dist.barrier(group=peers.group)
    if old_frozen != frozen and old_frozen in cache.boundaries():
        cache.extend(old_frozen, frozen, lambda v: run(v, old_frozen, frozen), batch_size=chunk, only=only)
    if shared:
        assert peers is not None
        dist.barrier(group=peers.group)
