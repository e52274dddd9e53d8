"""What the cache answers: a batched lookup's result and the counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from elastic_pipe.cache.errors import CacheError

__all__ = ["CacheLookup", "CacheStats", "PendingLookup", "TierStats"]


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """The answer to one batched read.

    Attributes:
        sample_ids: the ids asked for (CPU, int64).
        hit: bool mask over ``sample_ids``.
        values: the cached outputs of the hits, in the order of ``sample_ids[hit]``, on the cache's device.
    """

    sample_ids: torch.Tensor
    hit: torch.Tensor
    values: torch.Tensor

    @property
    def num_hits(self) -> int:
        """Number of ids served from the cache."""
        return int(self.hit.sum())

    @property
    def missing_ids(self) -> torch.Tensor:
        """Ids to recompute."""
        return self.sample_ids[~self.hit]

    def to(self, dtype: torch.dtype) -> CacheLookup:
        """The lookup with its hits cast to ``dtype`` where they are (on the device: entries stored narrower than
        the layers after the boundary expect are widened after the copy, not before); ``self`` when they are."""
        if self.values.dtype == dtype:
            return self
        return dataclasses.replace(self, values=self.values.to(dtype))

    def merge(self, computed: torch.Tensor) -> torch.Tensor:
        """The whole batch: cached rows for hits, ``computed`` (the misses, in order) for the rest.

        Raises:
            CacheError: ``computed`` has the wrong number of rows or a shape different from the cached rows.
        """
        misses = self.sample_ids.numel() - self.num_hits
        if computed.shape[0] != misses:
            raise CacheError(f"merge needs {misses} computed rows (one per miss), got {computed.shape[0]}")
        if misses == 0:
            return self.values
        if self.num_hits == 0:
            return computed
        if computed.shape[1:] != self.values.shape[1:] or computed.dtype != self.values.dtype:
            raise CacheError(
                f"computed rows are {tuple(computed.shape[1:])} {computed.dtype}, cached rows "
                f"{tuple(self.values.shape[1:])} {self.values.dtype}; expected the same"
            )
        out = torch.empty((self.sample_ids.numel(), *computed.shape[1:]), dtype=computed.dtype, device=computed.device)
        hit = self.hit.to(computed.device)
        out[hit] = self.values.to(computed.device)
        out[~hit] = computed
        return out


@dataclass(frozen=True, slots=True)
class TierStats:
    """One tier's state as this process sees it.

    Attributes:
        name: ``"device"``, ``"host"`` or ``"disk"``.
        budget_bytes: the tier's budget.
        used_bytes: bytes its segments reserve (for file tiers: every process's files of this cache name).
        entries: valid entries over all boundaries.
        hits: ids this process was served from the tier.
    """

    name: str
    budget_bytes: int
    used_bytes: int
    entries: int
    hits: int


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of this process since the cache was built (or :meth:`ActivationCache.reset_stats`).

    Attributes:
        hits: ids served from some tier.
        misses: ids found in no tier (or bypassed).
        stored: entries newly written.
        rejected: ids a put could place in no tier (all budgets full).
        corrupt: entries that failed verification and were reported as misses (then recomputed).
        tiers: per-tier state, device first.
        corrupt_files: segment files deleted unread because their header (or index region) was damaged.
        stale_files: segment files deleted unread because they carried another fingerprint.
        full_files: host or disk segments not created because the file system refused the space (full or over
            quota); their entries spilled to the next tier or were recomputed.
    """

    hits: int
    misses: int
    stored: int
    rejected: int
    corrupt: int
    tiers: tuple[TierStats, ...]
    corrupt_files: int = 0
    stale_files: int = 0
    full_files: int = 0

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0 when nothing was looked up)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready form."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "stored": self.stored,
            "rejected": self.rejected,
            "corrupt": self.corrupt,
            "corrupt_files": self.corrupt_files,
            "stale_files": self.stale_files,
            "full_files": self.full_files,
            "hit_rate": self.hit_rate,
            "tiers": [
                {"name": t.name, "budget_bytes": t.budget_bytes, "used_bytes": t.used_bytes, "entries": t.entries}
                | {"hits": t.hits}
                for t in self.tiers
            ],
        }


class PendingLookup:
    """A lookup issued ahead of time (:meth:`ActivationCache.prefetch`); :meth:`result` hands it over.

    On a CUDA device the copies run on a side stream; :meth:`result` makes the caller's current stream wait for
    them (no host synchronization) and marks the values as used by that stream, so the allocator does not recycle
    them early. On a CPU device the lookup is already complete.
    """

    def __init__(self, lookup: CacheLookup, event: torch.cuda.Event | None = None) -> None:
        self._lookup = lookup
        self._event = event

    def result(self) -> CacheLookup:
        """The lookup, safe to use on the current stream."""
        if self._event is not None:
            stream = torch.cuda.current_stream(self._lookup.values.device)
            stream.wait_event(self._event)
            self._lookup.values.record_stream(stream)
            self._event = None
        return self._lookup
