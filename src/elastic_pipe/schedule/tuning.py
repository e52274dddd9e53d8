"""Choose the number of micro-batches M for a pipeline of K stages and a global batch.

More micro-batches shrink the pipeline bubble ((K - 1) / (M + K - 1) for GPipe and 1F1B) but make each one
smaller, and a small micro-batch wastes time on per-micro-batch overhead: eager PyTorch issues about 1 ms of
host work per transformer block and micro-batch, so micro-batches of 64 samples or fewer are host-bound on a
modern GPU (measured on H200, docs/schedule.md). PipeTransformer profiled M in [K, 6K] once per K and kept the
best (published: M = 16 for K = 8, 4, 2); :func:`tune_microbatches` does the same on the simulator, from
per-stage costs as a function of the micro-batch size, measured or modelled (:class:`LinearCost`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_pipe.schedule.errors import CHECK, ScheduleError, ScheduleTypeError
from elastic_pipe.schedule.generators import generate
from elastic_pipe.schedule.ir import MAX_CHUNKS, MAX_MICROBATCHES, MAX_RANKS
from elastic_pipe.schedule.simulate import simulate

__all__ = [
    "EAGER_HOST_SECONDS_PER_BLOCK",
    "PUBLISHED_SEARCH_FACTORS",
    "LinearCost",
    "MicrobatchChoice",
    "MicrobatchCost",
    "StageTimes",
    "TuningRow",
    "tune_microbatches",
]

#: Host time eager PyTorch spends per transformer block and micro-batch (forward + backward), measured on the
#: lent H200 machine with torch 2.11 (REFERENCE.md section 7).
EAGER_HOST_SECONDS_PER_BLOCK = 1e-3
#: PipeTransformer searched M in [K, 6K]: the smallest and largest multiple of the pipeline length tried.
PUBLISHED_SEARCH_FACTORS = (1, 6)
#: Share of a micro-batch's host time spent launching the forward; the backward launches about twice as many
#: kernels (input and weight gradients), hence one third / two thirds.
HOST_FORWARD_SHARE = 1.0 / 3.0


@dataclass(frozen=True)
class StageTimes:
    """Per-stage time of one micro-batch (seconds), everything included (device and host).

    Attributes:
        forward: forward time per stage.
        backward: full backward time per stage.
        transfer: time for a micro-batch's activation (or gradient) to cross one stage boundary.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    transfer: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "forward", tuple(CHECK.floats("StageTimes forward", self.forward)))
        object.__setattr__(self, "backward", tuple(CHECK.floats("StageTimes backward", self.backward)))
        CHECK.float("StageTimes transfer", self.transfer)
        if len(self.forward) != len(self.backward) or not self.forward:
            raise ScheduleError(
                f"StageTimes needs as many forward as backward times (>= 1), got {len(self.forward)} and "
                f"{len(self.backward)}"
            )
        values = (*self.forward, *self.backward, self.transfer)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ScheduleError(f"StageTimes values must be finite and >= 0, got {values!r}")


#: Micro-batch size (samples) -> per-stage times; a function (modelled or interpolating measurements).
MicrobatchCost = Callable[[int], StageTimes]


@dataclass(frozen=True)
class LinearCost:
    """Modelled cost: device time linear in the micro-batch size plus a fixed host time per micro-batch.

    ``forward(b) = b * forward_per_sample + host * HOST_FORWARD_SHARE`` and
    ``backward(b) = b * backward_per_sample + host * (1 - HOST_FORWARD_SHARE)`` per stage, with ``host`` that
    stage's ``host_per_microbatch``. By default host time is added (the conservative choice: nothing hides it).
    With ``overlap=True`` an action takes ``max(device, host)`` instead: the host queues kernels ahead of the
    GPU, so host time only shows once it exceeds the device time (the host-bound regime of small
    micro-batches). Measured on 2 H200s the truth lies between the two (docs/schedule.md).

    Attributes:
        forward_per_sample: per stage, device forward seconds per sample.
        backward_per_sample: per stage, device backward seconds per sample.
        host_per_microbatch: per stage, host seconds per micro-batch (e.g. blocks on the stage times
            :data:`EAGER_HOST_SECONDS_PER_BLOCK`).
        transfer_per_sample: seconds per sample to cross one stage boundary (activation bytes / bandwidth).
        transfer_latency: fixed seconds per crossing (~45 us per NCCL message measured on NVLink).
        overlap: combine host and device time with ``max`` instead of ``+``.
    """

    forward_per_sample: tuple[float, ...]
    backward_per_sample: tuple[float, ...]
    host_per_microbatch: tuple[float, ...]
    transfer_per_sample: float = 0.0
    transfer_latency: float = 0.0
    overlap: bool = False

    def __post_init__(self) -> None:
        for key in ("forward_per_sample", "backward_per_sample", "host_per_microbatch"):
            object.__setattr__(self, key, tuple(CHECK.floats(f"LinearCost {key}", getattr(self, key))))
        CHECK.float("LinearCost transfer_per_sample", self.transfer_per_sample)
        CHECK.float("LinearCost transfer_latency", self.transfer_latency)
        lengths = {len(self.forward_per_sample), len(self.backward_per_sample), len(self.host_per_microbatch)}
        if len(lengths) != 1 or 0 in lengths:
            raise ScheduleError(
                "LinearCost needs one forward_per_sample, backward_per_sample and host_per_microbatch value per "
                f"stage, got lengths {len(self.forward_per_sample)}, {len(self.backward_per_sample)}, "
                f"{len(self.host_per_microbatch)}"
            )

    @classmethod
    def uniform(
        cls,
        stages: int,
        *,
        forward_per_sample: float,
        backward_per_sample: float,
        blocks_per_stage: float,
        host_per_block: float = EAGER_HOST_SECONDS_PER_BLOCK,
        transfer_per_sample: float = 0.0,
        transfer_latency: float = 0.0,
        overlap: bool = False,
    ) -> LinearCost:
        """Equal stages of ``blocks_per_stage`` blocks (per-sample times are per stage)."""
        return cls(
            forward_per_sample=(forward_per_sample,) * stages,
            backward_per_sample=(backward_per_sample,) * stages,
            host_per_microbatch=(blocks_per_stage * host_per_block,) * stages,
            transfer_per_sample=transfer_per_sample,
            transfer_latency=transfer_latency,
            overlap=overlap,
        )

    def __call__(self, size: int) -> StageTimes:
        """Per-stage times of one micro-batch of ``size`` samples."""
        combine = max if self.overlap else _add
        host_f = [h * HOST_FORWARD_SHARE for h in self.host_per_microbatch]
        host_b = [h * (1.0 - HOST_FORWARD_SHARE) for h in self.host_per_microbatch]
        return StageTimes(
            forward=tuple(combine(size * f, h) for f, h in zip(self.forward_per_sample, host_f, strict=True)),
            backward=tuple(combine(size * b, h) for b, h in zip(self.backward_per_sample, host_b, strict=True)),
            transfer=self.transfer_latency + size * self.transfer_per_sample,
        )


def _add(a: float, b: float) -> float:
    return a + b


@dataclass(frozen=True)
class TuningRow:
    """One candidate of the search: its simulated step time and throughput."""

    microbatches: int
    microbatch_size: int
    makespan: float
    throughput: float
    bubble_fraction: float
    peak_activations: int


@dataclass(frozen=True)
class MicrobatchChoice:
    """The chosen micro-batch count and the table it was chosen from (highest throughput; ties -> fewer)."""

    microbatches: int
    microbatch_size: int
    makespan: float
    throughput: float
    table: tuple[TuningRow, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data."""
        return {
            "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size,
            "makespan": self.makespan,
            "throughput": self.throughput,
            "table": [vars(row) for row in self.table],
        }


def tune_microbatches(
    cost: MicrobatchCost | Mapping[int, StageTimes],
    global_batch: int,
    pipe_len: int,
    *,
    kind: str = "1f1b",
    chunks: int = 1,
    candidates: Iterable[int] | None = None,
) -> MicrobatchChoice:
    """Simulate one step for each candidate M and return the fastest, with the whole table.

    Args:
        cost: micro-batch size -> :class:`StageTimes` with ``pipe_len * chunks`` stages (a function, e.g. a
            :class:`LinearCost`, or a mapping of measured sizes).
        global_batch: samples per step and pipeline replica.
        pipe_len: pipeline length K (ranks).
        kind: schedule kind (see :data:`elastic_pipe.schedule.GENERATORS`).
        chunks: stages per rank.
        candidates: micro-batch counts to try; default K..6K, the published search range. Counts that do not
            divide ``global_batch`` evenly, or that the schedule kind refuses, are skipped.

    Raises:
        ScheduleError: no candidate is feasible, a measured size is missing, or the costs are malformed.
    """
    if not (callable(cost) or isinstance(cost, Mapping)):
        raise ScheduleTypeError(f"cost must be a function of the micro-batch size or a mapping, got {cost!r}")
    CHECK.int("global_batch", global_batch, lo=1)
    CHECK.int("pipe_len", pipe_len, lo=1, hi=MAX_RANKS)
    CHECK.str("kind", kind)
    CHECK.int("chunks", chunks, lo=1, hi=MAX_CHUNKS)
    if candidates is not None:
        candidates = CHECK.ints("candidates", candidates, hi=MAX_MICROBATCHES)
    low, high = PUBLISHED_SEARCH_FACTORS
    tried = sorted(set(candidates if candidates is not None else range(low * pipe_len, high * pipe_len + 1)))
    rows: list[TuningRow] = []
    for mbs in tried:
        if mbs < 1 or global_batch % mbs:
            continue
        try:
            schedule = generate(kind, pipe_len, mbs, chunks)
        except ScheduleError:
            continue
        size = global_batch // mbs
        times = _lookup(cost, size)
        sim = simulate(schedule, times.forward, times.backward, transfer=times.transfer)
        rows.append(
            TuningRow(
                microbatches=mbs,
                microbatch_size=size,
                makespan=sim.makespan,
                throughput=global_batch / sim.makespan if sim.makespan > 0 else math.inf,
                bubble_fraction=sim.bubble_fraction,
                peak_activations=max(sim.peak_activations),
            )
        )
    if not rows:
        raise ScheduleError(
            f"no micro-batch count in {tried[:3]}..{tried[-3:] if tried else []} divides global_batch={global_batch}"
            f" and suits kind={kind!r} with pipe_len={pipe_len}, chunks={chunks}"
        )
    best = min(rows, key=lambda r: (r.makespan, r.microbatches))
    return MicrobatchChoice(best.microbatches, best.microbatch_size, best.makespan, best.throughput, tuple(rows))


def _lookup(cost: MicrobatchCost | Mapping[int, StageTimes], size: int) -> StageTimes:
    if isinstance(cost, Mapping):
        if size not in cost:
            raise ScheduleError(f"no measured cost for micro-batch size {size}; measured sizes: {sorted(cost)}")
        return cost[size]
    return cost(size)
