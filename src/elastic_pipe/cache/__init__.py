"""AutoCache: a tiered cache of the frozen prefix's output activations (device, shared host memory, disk),
keyed by (sample id, frozen boundary), with budgets, boundary moves and a pay-off decision.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.cache.cache import ActivationCache
from elastic_pipe.cache.config import Augmentation, CacheConfig, CacheTiers, HostKind, OnRandomAugmentation
from elastic_pipe.cache.decision import CacheDecision, decide, payoff_threshold, time_call
from elastic_pipe.cache.dtypes import STORAGE_DTYPES, parse_storage_dtype, stored_dtype
from elastic_pipe.cache.errors import CacheDirError, CacheError, CacheTypeError
from elastic_pipe.cache.fingerprint import prefix_fingerprint
from elastic_pipe.cache.payoff import expected_read_seconds, measure_payoff, measure_tiered_payoff
from elastic_pipe.cache.results import CacheLookup, CacheStats, PendingLookup, TierStats
from elastic_pipe.types import parse_bytes  # the one byte-size grammar, re-exported

__all__ = [
    "STORAGE_DTYPES",
    "ActivationCache",
    "Augmentation",
    "CacheConfig",
    "CacheDecision",
    "CacheDirError",
    "CacheError",
    "CacheLookup",
    "CacheStats",
    "CacheTiers",
    "CacheTypeError",
    "HostKind",
    "OnRandomAugmentation",
    "PendingLookup",
    "TierStats",
    "decide",
    "expected_read_seconds",
    "measure_payoff",
    "measure_tiered_payoff",
    "parse_bytes",
    "parse_storage_dtype",
    "payoff_threshold",
    "prefix_fingerprint",
    "stored_dtype",
    "time_call",
]
