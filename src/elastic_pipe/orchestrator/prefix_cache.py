"""The frozen prefix's activation cache on a stage-0 rank: carried to a new boundary, judged, filled."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from elastic_pipe import cache as acache
from elastic_pipe.orchestrator.workload import Split

__all__ = ["fill_cache", "prepare_cache"]

log = logging.getLogger(__name__)

#: Runs sub-layers ``lo:hi`` on a batch (``run(x, lo, hi)``), under ``no_grad``.
RunSublayers = Callable[[torch.Tensor, int, int], torch.Tensor]


def prepare_cache(
    cache: acache.ActivationCache,
    data: Split,
    *,
    mode: str,
    old_frozen: int,
    frozen: int,
    per_replica: int,
    chunk: int,
    device: torch.device,
    run: RunSublayers,
) -> tuple[bool, str]:
    """Carry cached entries from ``old_frozen`` to ``frozen``, decide whether reading pays, fill when it does.

    Args:
        cache: the rank's activation cache.
        data: the training split.
        mode: ``"on"`` (always read) or ``"auto"`` (read when :func:`elastic_pipe.cache.measure_payoff` says so).
        old_frozen: the boundary before the transition (0: none).
        frozen: the new boundary (number of frozen sub-layers, > 0).
        per_replica: samples per replica per step (the payoff is measured on one such batch).
        chunk: samples per prefix forward when filling.
        device: where the inputs go.
        run: runs a range of sub-layers.

    Returns:
        Whether stage 0 reads the cache, and why.
    """
    if old_frozen and old_frozen != frozen and old_frozen in cache.boundaries():
        # Only the newly frozen sub-layers run on the cached entries; then the old boundary is dropped.
        cache.extend(old_frozen, frozen, lambda v: run(v, old_frozen, frozen))
        cache.drop(old_frozen)
    if mode == "on":
        enabled, reason = True, "cache = 'on'"
    else:
        decision = acache.measure_payoff(
            cache,
            data.sample_ids[:per_replica],
            frozen,
            data.inputs[:per_replica].to(device),
            lambda v: run(v, 0, frozen),
        )
        enabled, reason = decision.enabled, decision.reason
    if enabled:
        # Every rank may be handed any sample in a later epoch, so the whole training split is cached.
        fill_cache(cache, data, frozen, chunk=chunk, device=device, run_prefix=lambda v: run(v, 0, frozen))
    return enabled, reason


def fill_cache(
    cache: acache.ActivationCache,
    data: Split,
    frozen: int,
    *,
    chunk: int,
    device: torch.device,
    run_prefix: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Store the frozen prefix's output for every training sample this rank may be handed.

    The sampler reshuffles and re-shards every epoch, so a rank sees a different part of the data each
    epoch: a cache filled only by the samples a rank happened to train on would hit about 1/replicas of the
    time, and the ranks that miss would hold up the others at every gradient sync. One pass of the frozen
    prefix over the training set (only the misses run; entries carried over by ``extend`` are reused) makes
    every later read a hit, for the price of about one epoch of frozen-prefix forwards. It stops early,
    with a warning, when the cache's budgets are full.

    Args:
        cache: the rank's activation cache.
        data: the training split.
        frozen: the boundary (number of frozen sub-layers) the entries are stored under.
        chunk: samples per prefix forward.
        device: where the inputs go.
        run_prefix: runs the frozen prefix on a batch of inputs.
    """
    ids_all = data.sample_ids
    rejected = cache.stats.rejected
    for start in range(0, int(ids_all.shape[0]), chunk):
        ids = ids_all[start : start + chunk]
        inputs = data.inputs[start : start + chunk].to(device)
        cache.get_or_compute(ids, frozen, inputs, run_prefix)
        if cache.stats.rejected > rejected:
            log.warning(
                "activation cache full after %d of %d samples at boundary %d; raise cache_mb to cache them all",
                start,
                int(ids_all.shape[0]),
                frozen,
            )
            break
