"""The pay-off decision: cache the frozen prefix only when reading its output is faster than recomputing it.

PipeTransformer switched its cache on only from a measured threshold (3 frozen blocks of 12 for ViT-B, 5 of 24 for
BERT-large): below it, copying a cached activation into the step costs more than running the few frozen layers.
The threshold depends on the hardware, the tier the cache serves from and the batch, so it is measured, not
assumed: :func:`measure_payoff` times both paths on the real batch and :func:`decide` compares the numbers.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real

import torch

from elastic_pipe.cache.errors import CHECK, CacheError

__all__ = ["CacheDecision", "decide", "payoff_threshold", "time_call"]

_STATISTICS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}
#: Reading must be this many times faster than recomputing; 1.0 means "any gain at all".
DEFAULT_MARGIN = 1.0


@dataclass(frozen=True, slots=True)
class CacheDecision:
    """Whether to serve the frozen prefix from the cache, with the numbers behind the choice.

    Attributes:
        enabled: True when reading (times ``margin``) is faster than recomputing.
        read_seconds: measured time to fetch one batch's prefix output from the cache.
        recompute_seconds: measured time to recompute the frozen prefix for the same batch.
        margin: the factor reading had to beat recomputing by.
        reason: one human-readable sentence with the numbers.
    """

    enabled: bool
    read_seconds: float
    recompute_seconds: float
    margin: float
    reason: str

    def __post_init__(self) -> None:
        _check_times(self.read_seconds, self.recompute_seconds)
        if not math.isfinite(self.margin) or self.margin <= 0:
            raise CacheError(f"CacheDecision.margin must be a finite number > 0, got {self.margin!r}")

    @property
    def speedup(self) -> float:
        """Recompute time over read time (how many times faster the cache is); ``inf`` for a free read."""
        return math.inf if self.read_seconds == 0 else self.recompute_seconds / self.read_seconds

    def to_dict(self) -> dict[str, float | bool | str]:
        """Plain JSON-ready form."""
        return {
            "enabled": self.enabled,
            "read_seconds": self.read_seconds,
            "recompute_seconds": self.recompute_seconds,
            "speedup": self.speedup,
            "margin": self.margin,
            "reason": self.reason,
        }


def _check_times(read_seconds: float, recompute_seconds: float) -> None:
    # an infinite read time stands for "no cache to read from" (e.g. nothing frozen): never enabled
    CHECK.number("read_seconds", read_seconds)
    CHECK.number("recompute_seconds", recompute_seconds)
    if math.isnan(read_seconds) or read_seconds < 0:
        raise CacheError(f"read_seconds must be a number >= 0 (inf: unavailable), got {read_seconds!r}")
    if not math.isfinite(recompute_seconds) or recompute_seconds < 0:
        raise CacheError(f"recompute_seconds must be a finite number >= 0, got {recompute_seconds!r}")


def decide(read_seconds: float, recompute_seconds: float, *, margin: float = DEFAULT_MARGIN) -> CacheDecision:
    """Enable the cache when ``read_seconds * margin < recompute_seconds``.

    Args:
        read_seconds: time to fetch one batch from the cache (s); ``inf`` when there is nothing to read.
        recompute_seconds: time to recompute the frozen prefix for that batch (s).
        margin: how many times faster reading must be; use > 1 to demand a clear win over measurement noise.

    Returns:
        The decision, its numbers and a one-sentence reason.

    Raises:
        CacheError: a time is negative or NaN, the recompute time is infinite, or ``margin <= 0``.
    """
    _check_times(read_seconds, recompute_seconds)
    if not math.isfinite(CHECK.number("margin", margin)) or margin <= 0:
        raise CacheError(f"margin must be a finite number > 0, got {margin!r}")
    enabled = read_seconds * margin < recompute_seconds
    verb = "enable" if enabled else "disable"
    relation = "<" if enabled else ">="
    reason = (
        f"{verb} cache: read {read_seconds * 1e3:.3f} ms x margin {margin:g} {relation} "
        f"recompute {recompute_seconds * 1e3:.3f} ms"
    )
    return CacheDecision(enabled, float(read_seconds), float(recompute_seconds), float(margin), reason)


def payoff_threshold(
    read_seconds: float | Sequence[float], recompute_seconds: Sequence[float], *, margin: float = DEFAULT_MARGIN
) -> int | None:
    """The smallest frozen count from which the cache pays, given per-count measurements.

    Args:
        read_seconds: read time per frozen count (or one value for all counts: the prefix output has the same
            size whatever the boundary in a transformer).
        recompute_seconds: ``recompute_seconds[k]`` is the time to recompute ``k`` frozen layers.
        margin: as in :func:`decide`.

    Returns:
        The first ``k`` whose decision is "enable", or ``None`` if caching never pays.

    Raises:
        CacheError: the two sequences differ in length, or a time is invalid.
    """
    recompute_seconds = [
        CHECK.number(f"recompute_seconds[{i}]", r)
        for i, r in enumerate(CHECK.items("recompute_seconds", recompute_seconds))
    ]
    if isinstance(read_seconds, Real):
        reads = [float(read_seconds)] * len(recompute_seconds)
    else:
        reads = [
            CHECK.number(f"read_seconds[{i}]", r)
            for i, r in enumerate(CHECK.items("read_seconds", read_seconds, empty=True))
        ]
    if len(reads) != len(recompute_seconds):
        raise CacheError(
            f"read_seconds has {len(reads)} entries but recompute_seconds has {len(recompute_seconds)}; expected equal"
        )
    for k, (read, recompute) in enumerate(zip(reads, recompute_seconds, strict=True)):
        if decide(read, recompute, margin=margin).enabled:
            return k
    return None


#: The most timed (or warm-up) runs :func:`time_call` makes: each runs the function once, so a larger count is a
#: mistake that would run for hours.
MAX_REPEATS = 1_000


def time_call(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, statistic: str = "median") -> float:
    """Wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs, synchronizing CUDA around each.

    Args:
        fn: the call to time (its result is discarded).
        repeats: timed runs, >= 1.
        warmup: untimed runs first (allocator and cache warm-up), >= 0.
        statistic: ``"median"``, or ``"min"`` (the better estimate of the intrinsic cost on a machine shared with
            other work, where interference only ever adds time).

    Returns:
        Seconds per call.

    Raises:
        CacheError: ``repeats < 1``, ``warmup < 0`` or an unknown statistic.
    """
    CHECK.callable("fn", fn)
    CHECK.int("repeats", repeats, hi=MAX_REPEATS)
    CHECK.int("warmup", warmup, hi=MAX_REPEATS)
    if repeats < 1 or warmup < 0:
        raise CacheError(f"time_call needs repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    if CHECK.str("statistic", statistic) not in _STATISTICS:
        raise CacheError(f"unknown statistic {statistic!r}; expected one of: {', '.join(sorted(_STATISTICS))}")
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return _STATISTICS[statistic](samples)
