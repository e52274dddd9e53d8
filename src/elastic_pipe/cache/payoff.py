"""Measure the pay-off on a real batch: time a cache read against recomputing the frozen prefix."""

from __future__ import annotations

from collections.abc import Callable

import torch

from elastic_pipe.cache.cache import ActivationCache
from elastic_pipe.cache.decision import DEFAULT_MARGIN, CacheDecision, decide, time_call
from elastic_pipe.cache.errors import CacheError

__all__ = ["measure_payoff"]


def measure_payoff(
    cache: ActivationCache,
    sample_ids: torch.Tensor,
    boundary: int,
    inputs: torch.Tensor,
    prefix: Callable[[torch.Tensor], torch.Tensor],
    *,
    repeats: int = 5,
    warmup: int = 1,
    margin: float = DEFAULT_MARGIN,
) -> CacheDecision:
    """Time ``cache.get(sample_ids, boundary)`` against ``prefix(inputs)`` (under ``no_grad``) and decide.

    The batch is stored first if it is not cached yet, so the read is a full hit from whichever tier the budgets
    put it in. The measurement's own lookups are not counted in ``cache.stats``.

    Args:
        cache: the cache to measure (its configured tiers and device).
        sample_ids: a representative batch's ids.
        boundary: the frozen boundary.
        inputs: that batch's model inputs.
        prefix: runs frozen layers ``0..boundary-1``.
        repeats: timed runs (median).
        warmup: untimed runs first.
        margin: reading must be this many times faster.

    Returns:
        The decision with both times.

    Raises:
        CacheError: the batch cannot be cached whole (budgets too small, or the cache bypasses itself).
    """
    with torch.no_grad(), cache.uncounted():
        if cache.get(sample_ids, boundary).num_hits < sample_ids.numel():
            cache.put(sample_ids, boundary, prefix(inputs))
        if cache.get(sample_ids, boundary).num_hits < sample_ids.numel():
            raise CacheError(
                f"cannot measure: a batch of {sample_ids.numel()} samples does not fit in {cache!r} "
                f"(or the cache bypasses itself)"
            )
        read = time_call(lambda: cache.get(sample_ids, boundary), repeats=repeats, warmup=warmup)
        recompute = time_call(lambda: prefix(inputs), repeats=repeats, warmup=warmup)
    return decide(read, recompute, margin=margin)
