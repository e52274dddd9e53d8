"""Measure the pay-off on a real batch: time a cache read against recomputing the frozen prefix, for one batch
(:func:`measure_payoff`) or for a whole fill spread over the tiers (:func:`measure_tiered_payoff`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from elastic_pipe.cache.cache import ActivationCache
from elastic_pipe.cache.decision import DEFAULT_MARGIN, CacheDecision, decide, time_call
from elastic_pipe.cache.errors import CHECK, CacheError

__all__ = ["expected_read_seconds", "measure_payoff", "measure_tiered_payoff"]


def _check_measure(cache: object, inputs: object, boundary: object, prefix: object) -> None:
    """The arguments both measurements take (their timing counts are :func:`time_call`'s to check)."""
    CHECK.instance("cache", cache, ActivationCache)
    CHECK.instance("inputs", inputs, torch.Tensor)
    CHECK.int("boundary", boundary)
    CHECK.callable("prefix", prefix)


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
    _check_measure(cache, inputs, boundary, prefix)
    CHECK.instance("sample_ids", sample_ids, torch.Tensor)
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


def expected_read_seconds(spread: dict[str, int], tier_seconds: dict[str, float], recompute_seconds: float) -> float:
    """A batch's expected read time when a boundary's entries lie spread over the tiers as in ``spread``.

    The sampler reshuffles every epoch, so a batch draws from each tier in proportion to the entries it holds:
    the expected time is each tier's whole-batch read time weighted by its share of the entries, plus the share
    that fits nowhere at the recompute time (a linear model: it leaves out a tier's fixed cost per batch).

    Args:
        spread: entries per tier name and ``"none"`` (:meth:`ActivationCache.placement`).
        tier_seconds: whole-batch read seconds per tier name (:meth:`ActivationCache.time_reads`).
        recompute_seconds: seconds to recompute the prefix for a batch.

    Returns:
        Seconds; ``inf`` when no entry at all would be cached.

    Example:
        >>> expected_read_seconds({"device": 1, "host": 3, "none": 0}, {"device": 1.0, "host": 5.0}, 9.0)
        4.0
    """
    CHECK.mapping("spread", spread)
    CHECK.mapping("tier_seconds", tier_seconds)
    CHECK.float("recompute_seconds", recompute_seconds)
    total = sum(spread.values())
    if total == 0 or spread.get("none", 0) == total:
        return math.inf
    seconds = spread.get("none", 0) * recompute_seconds
    for name, entries in spread.items():
        if name != "none" and entries:
            seconds += entries * tier_seconds[name]
    return seconds / total


def measure_tiered_payoff(
    cache: ActivationCache,
    inputs: torch.Tensor,
    boundary: int,
    prefix: Callable[[torch.Tensor], torch.Tensor],
    *,
    samples: int,
    repeats: int = 5,
    warmup: int = 1,
    margin: float = DEFAULT_MARGIN,
) -> CacheDecision:
    """Decide for a whole fill: time one batch's read from every tier and the recompute, and weigh each tier by
    the share of the ``samples`` entries it would hold (:func:`expected_read_seconds`).

    Unlike :func:`measure_payoff`, which times whichever tier its one batch lands in (the device tier while it
    has room), this accounts for a cache larger than its device tier: a host- or disk-heavy fill is judged at
    the host's or disk's read speed. Nothing is stored in the cache.

    Args:
        cache: the cache to be filled (its tiers, budgets left and device).
        inputs: a representative batch's model inputs.
        boundary: the frozen boundary.
        prefix: runs frozen layers ``0..boundary-1``.
        samples: samples the fill would cache (the training split).
        repeats: timed runs (minimum).
        warmup: untimed runs first.
        margin: reading must be this many times faster.

    Returns:
        The decision; its reason lists the entries per tier and each tier's read time.
    """
    _check_measure(cache, inputs, boundary, prefix)
    CHECK.int("samples", samples)
    with torch.no_grad():
        rows = prefix(inputs)
        recompute = time_call(lambda: prefix(inputs), repeats=repeats, warmup=warmup, statistic="min")
    spread = cache.placement(boundary, tuple(rows.shape[1:]), rows.dtype, samples)
    tier_seconds = cache.time_reads(rows, repeats=repeats, warmup=warmup) if spread["none"] < samples else {}
    expected = expected_read_seconds(spread, tier_seconds, recompute)
    decision = decide(expected, recompute, margin=margin)
    where = ", ".join(
        f"{name} {entries}" + (f" ({tier_seconds[name] * 1e3:.3f} ms)" if name in tier_seconds else "")
        for name, entries in spread.items()
    )
    return dataclasses.replace(decision, reason=f"{decision.reason}; entries per tier: {where}")
