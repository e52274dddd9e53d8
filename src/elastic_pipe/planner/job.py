"""The training job a plan is for: batch, length, freeze policy, layout choices, cache."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_pipe.planner.errors import CHECK, PlannerError
from elastic_pipe.schedule import GENERATORS, MAX_AUTO_VIRTUAL, MAX_CHUNKS, accepts, refusal

__all__ = [
    "CACHE_FILLS",
    "CACHE_TIERS",
    "INTERLEAVED_CHUNKS",
    "MAX_EPOCHS",
    "MAX_MICROBATCHES",
    "MAX_PIPE_LEN",
    "VIRTUAL_AUTO",
    "JobSpec",
]

#: Cache tiers, fastest first; ``auto`` takes the first whose capacity holds what a rank caches.
CACHE_TIERS = ("gpu", "host", "disk")
#: When a new cache boundary is filled: during the first epoch at it, each rank caching the samples it trains on
#: (published AutoCache), or in the transition, each stage-0 rank extending its cache through the newly frozen
#: units for every training sample (this package's orchestrator).
CACHE_FILLS = ("epoch", "transition")
#: Stages per rank for the interleaved schedule when the job does not set ``virtual``; also the stages per rank
#: each epoch's interleaved alternative is predicted with (:attr:`~elastic_pipe.planner.EpochPlan.interleaved`).
INTERLEAVED_CHUNKS = 2
#: ``JobSpec.virtual`` that lets the plan choose the stages per rank of every epoch (``[pipeline] virtual = "auto"``).
VIRTUAL_AUTO = "auto"


#: Upper bounds on a job's sizes: the planner prices every layout (pipeline length, micro-batch count) of every
#: epoch, so its time grows with each; the limits sit well past real jobs (a few hundred epochs, tens of stages)
#: and keep one plan within seconds (measured: 1000 epochs of vit-b16 on 16 GPUs plan in 3 s, 10000 in 30 s).
MAX_EPOCHS = 2_000
MAX_MICROBATCHES = 4_096
MAX_PIPE_LEN = 1_024


def _default_policy_options() -> dict[str, Any]:
    return {"alpha": 1 / 3}


@dataclass(frozen=True)
class JobSpec:
    """The training job to plan.

    Attributes:
        global_batch: samples per optimizer step over all replicas (kept fixed as replicas change).
        epochs: epochs to plan.
        steps_per_epoch: optimizer steps per epoch.
        policy: a freeze policy name of :data:`elastic_pipe.freeze.POLICIES` that decides from the epoch alone.
        policy_options: the policy's keyword options (``alpha`` for ``alpha``).
        frozen: an explicit frozen-unit count per epoch; overrides ``policy``.
        pipe_len: the initial pipeline length; ``None`` takes the fastest layout that fits memory.
        schedule: pipeline schedule kind ("1f1b", "gpipe", "zb1p", "interleaved").
        microbatches: a fixed micro-batch count per step and replica; ``None`` searches ``[K, 6K]``.
        cache: cache the frozen prefix's activations (where it pays).
        cache_tier: "auto" or one of :data:`CACHE_TIERS`.
        cache_fill: one of :data:`CACHE_FILLS`: "epoch" (the published cache fills while the first epoch at a
            boundary trains, which recomputes the newly frozen units and writes) or "transition" (the orchestrator
            extends the cache for the whole training set in the transition, priced into ``transition_seconds`` of
            the epoch, which then only reads; every stage-0 rank holds every sample).
        dataset_size: samples per epoch (for cache capacity); default ``global_batch * steps_per_epoch``.
        transition_seconds: cost of one reshape (moving stages, rebuilding groups); published ~17 s, assumed 5 s.
        solver: partition solver name.
        virtual: stages per rank v for ``schedule``; ``None`` takes :data:`INTERLEAVED_CHUNKS` for "interleaved"
            and 1 for the others. The schedule must accept it (1f1b and zb1p hold one stage per rank,
            interleaved at least two, gpipe any). Training takes the same v as ``[pipeline] virtual``
            (docs/schedule.md, "Which schedules run in training"). ``"auto"``: every epoch's layout is searched
            with the fewest stages per rank the schedule runs (:attr:`chunks`), then each v up to
            :data:`~elastic_pipe.schedule.MAX_AUTO_VIRTUAL` (training's limit too) the schedule runs is predicted at
            the chosen K and M and the fastest that fits memory is planned (the smaller v on a tie); the epoch
            reports them all (:attr:`~elastic_pipe.planner.EpochPlan.virtual_options`).
    """

    global_batch: int
    epochs: int
    steps_per_epoch: int
    policy: str = "alpha"
    policy_options: Mapping[str, Any] = field(default_factory=_default_policy_options)
    frozen: tuple[int, ...] | None = None
    pipe_len: int | None = None
    schedule: str = "1f1b"
    microbatches: int | None = None
    cache: bool = True
    cache_tier: str = "auto"
    cache_fill: str = "epoch"
    dataset_size: int | None = None
    transition_seconds: float = 5.0
    solver: str = "optimal"
    virtual: int | str | None = None

    def __post_init__(self) -> None:
        CHECK.int("JobSpec.global_batch", self.global_batch, lo=1)
        CHECK.int("JobSpec.epochs", self.epochs, lo=1, hi=MAX_EPOCHS)
        CHECK.int("JobSpec.steps_per_epoch", self.steps_per_epoch, lo=1)
        CHECK.optional_int("JobSpec.pipe_len", self.pipe_len, lo=1, hi=MAX_PIPE_LEN)
        CHECK.optional_int("JobSpec.microbatches", self.microbatches, lo=1, hi=MAX_MICROBATCHES)
        CHECK.optional_int("JobSpec.dataset_size", self.dataset_size, lo=1)
        if self.virtual != VIRTUAL_AUTO:
            CHECK.optional_int("JobSpec.virtual", self.virtual, lo=1, hi=MAX_CHUNKS)
        for key in ("policy", "schedule", "cache_tier", "cache_fill", "solver"):
            CHECK.str(f"JobSpec.{key}", getattr(self, key))
        CHECK.mapping("JobSpec.policy_options", self.policy_options)
        if self.frozen is not None:
            CHECK.ints("JobSpec.frozen", self.frozen, empty=True)
        CHECK.number("JobSpec.transition_seconds", self.transition_seconds)
        if self.schedule not in GENERATORS:
            raise PlannerError(f"unknown schedule {self.schedule!r}; expected one of {sorted(GENERATORS)}")
        reason = refusal(self.schedule, 1, 1, self.chunks)  # the stage counts per rank its generator takes
        if reason is not None:
            raise PlannerError(f"JobSpec.virtual={self.virtual}: {reason}")
        if self.cache_tier not in ("auto", *CACHE_TIERS):
            raise PlannerError(
                f"unknown cache tier {self.cache_tier!r} (cache_tier); expected one of {['auto', *CACHE_TIERS]}"
            )
        if self.cache_fill not in CACHE_FILLS:
            raise PlannerError(
                f"unknown cache fill {self.cache_fill!r} (cache_fill); expected one of {list(CACHE_FILLS)}"
            )
        if not (math.isfinite(self.transition_seconds) and self.transition_seconds >= 0):
            raise PlannerError(f"JobSpec.transition_seconds must be finite and >= 0, got {self.transition_seconds!r}")
        if self.frozen is not None and len(self.frozen) != self.epochs:
            raise PlannerError(f"JobSpec.frozen needs one count per epoch ({self.epochs}), got {self.frozen!r}")

    @property
    def chunks(self) -> int:
        """Stages per rank v: ``virtual``, or the schedule's default when it is ``None``; under ``"auto"`` the
        fewest the schedule runs (the layout search's, before v is chosen)."""
        if isinstance(self.virtual, int):
            return self.virtual
        if self.virtual == VIRTUAL_AUTO:
            return self.virtual_candidates[0]
        return INTERLEAVED_CHUNKS if self.schedule == "interleaved" else 1

    @property
    def virtual_candidates(self) -> tuple[int, ...]:
        """The v an ``"auto"`` job tries: those up to :data:`~elastic_pipe.schedule.MAX_AUTO_VIRTUAL` the schedule's
        generator accepts on one rank (:func:`~elastic_pipe.schedule.accepts`; its micro-batch and length constraints
        are checked per layout)."""
        return tuple(v for v in range(1, MAX_AUTO_VIRTUAL + 1) if accepts(self.schedule, 1, 1, v))

    @property
    def samples_per_epoch(self) -> int:
        """Samples the cache has to hold per boundary."""
        return self.dataset_size if self.dataset_size is not None else self.global_batch * self.steps_per_epoch
