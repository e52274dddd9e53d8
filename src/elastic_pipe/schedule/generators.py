"""Schedule generators: GPipe, 1F1B, interleaved 1F1B and zero-bubble ZB-H1, plus the registry.

Each generator is a pure function ``(ranks, microbatches, chunks) -> {rank: [Action, ...]}``; ``chunks`` is the
number of stages per rank (``ranks * chunks`` stages in all, stage ``s`` on rank ``s % ranks``, the looped
placement of torch's interleaved schedules). A generator refuses parameters it cannot schedule with a
:class:`ScheduleError` naming the constraint. Timelines below: 4 ranks, 4 micro-batches, equal costs, B = 2F.

GPipe (Huang et al. 2019): all forwards, then all backwards; every stage holds all ``m`` micro-batches::

    rank 0: F0 F1 F2 F3 .. .. .. .. .. .. .. .. .. B0 B0 B1 B1 B2 B2 B3 B3
    rank 3: .. .. .. F0 F1 F2 F3 B0 B0 B1 B1 B2 B2 B3 B3

1F1B (PipeDream-Flush, Narayanan et al. 2021): ``p - r - 1`` warm-up forwards on rank ``r``, then one forward
and one backward in turn, so stage ``s`` holds at most ``min(p - s, m)`` micro-batches; same bubble as GPipe.

Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): each rank holds ``v`` chunks; forwards go through
the chunks in groups of ``p`` micro-batches (depth first), which cuts the bubble to about ``(p - 1) / (v m)``.

ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): 1F1B with the backward split into ``I`` (input
gradient, on the critical path) and ``W`` (weight gradient, off it). Rank ``r`` keeps up to ``r`` weight passes
pending: the later ranks, which 1F1B leaves with spare activation memory (it holds ``p - r`` micro-batches on
rank ``r``), hurry the input gradients down the pipeline and fill the cool-down with deferred ``W``. Peak memory
is 1F1B's (at most ``p`` micro-batches on any rank); with equal F, I, W costs the bubble is a third of 1F1B's::

    rank 0: F0 F1 F2 F3 .. .. .. I0 W0 F4 I1 W1 ...
    rank 3: .. .. .. F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from elastic_pipe.schedule.errors import CHECK, ScheduleError
from elastic_pipe.schedule.ir import MAX_CHUNKS, MAX_MICROBATCHES, MAX_RANKS, Action, ActionKind, Schedule

__all__ = [
    "GENERATORS",
    "MAX_ACTIONS",
    "ScheduleGenerator",
    "check_shape",
    "generate",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "zb_h1",
]

FWD, BWD, IGRAD, WGRAD = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

#: The most actions a generator builds (``ranks * chunks * microbatches`` stage-micro-batch pairs, up to three
#: actions each): about a million, seconds of pure Python (1F1B with 128 ranks and 1024 micro-batches, 262k
#: actions, takes 2-4 s on a busy 2-core machine); the CLI keeps a tighter limit because it also simulates.
MAX_ACTIONS = 2**20


def check_shape(ranks: int, microbatches: int, chunks: int) -> None:
    """Raise :class:`ScheduleError` unless the three counts are ints in range and the schedule stays within
    :data:`MAX_ACTIONS`."""
    CHECK.int("ranks", ranks, lo=1, hi=MAX_RANKS)
    CHECK.int("microbatches", microbatches, lo=1, hi=MAX_MICROBATCHES)
    CHECK.int("chunks", chunks, lo=1, hi=MAX_CHUNKS)
    if 3 * ranks * chunks * microbatches > MAX_ACTIONS:
        raise ScheduleError(
            f"ranks={ranks} x chunks={chunks} x microbatches={microbatches} makes up to "
            f"{3 * ranks * chunks * microbatches} actions, above the limit of {MAX_ACTIONS}"
        )


class ScheduleGenerator(Protocol):
    """A schedule generator: per-rank ordered compute actions for ``ranks * chunks`` looped stages."""

    def __call__(self, ranks: int, microbatches: int, chunks: int) -> dict[int, list[Action]]: ...


def gpipe(ranks: int, microbatches: int, chunks: int = 1) -> dict[int, list[Action]]:
    """GPipe: every forward, then every backward (micro-batches in order, as torch's ScheduleGPipe).

    With ``chunks > 1`` a rank runs its stages breadth first, the order of torch's ScheduleLoopedBFS: all forwards
    of its lowest stage, then the next stage's; backwards from its highest stage down, latest micro-batch first.
    """
    check_shape(ranks, microbatches, chunks)
    out: dict[int, list[Action]] = {}
    backward_order = range(microbatches) if chunks == 1 else range(microbatches - 1, -1, -1)
    for rank in range(ranks):
        stages = [c * ranks + rank for c in range(chunks)]
        acts = [Action(s, FWD, mb) for s in stages for mb in range(microbatches)]
        acts += [Action(s, BWD, mb) for s in reversed(stages) for mb in backward_order]
        out[rank] = acts
    return out


def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> dict[int, list[Action]]:
    """1F1B: ``min(p - r - 1, m)`` warm-up forwards on rank ``r``, then alternate forward and backward."""
    check_shape(ranks, microbatches, chunks)
    if chunks != 1:
        raise ScheduleError(f"1f1b holds one stage per rank (chunks=1), got chunks={chunks}; use 'interleaved'")
    return {r: _one_f_one_b_rank(r, ranks, microbatches, split=False) for r in range(ranks)}


def zb_h1(ranks: int, microbatches: int, chunks: int = 1) -> dict[int, list[Action]]:
    """ZB-H1: 1F1B with split backwards; rank ``r`` keeps up to ``r`` weight-gradient passes pending."""
    check_shape(ranks, microbatches, chunks)
    if chunks != 1:
        raise ScheduleError(f"zb1p (ZB-H1) holds one stage per rank (chunks=1), got chunks={chunks}")
    return {r: _one_f_one_b_rank(r, ranks, microbatches, split=True) for r in range(ranks)}


def _one_f_one_b_rank(rank: int, ranks: int, mbs: int, *, split: bool) -> list[Action]:
    warmup = min(ranks - rank - 1, mbs)
    acts = [Action(rank, FWD, mb) for mb in range(warmup)]
    deferred = rank  # W passes kept pending (ZB-H1): the headroom 1F1B leaves rank r is r micro-batches
    next_w = 0
    for mb in range(mbs):
        if warmup + mb < mbs:
            acts.append(Action(rank, FWD, warmup + mb))
        if not split:
            acts.append(Action(rank, BWD, mb))
            continue
        acts.append(Action(rank, IGRAD, mb))
        if mb + 1 - next_w > deferred:
            acts.append(Action(rank, WGRAD, next_w))
            next_w += 1
    if split:
        acts += [Action(rank, WGRAD, mb) for mb in range(next_w, mbs)]
    return acts


def interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2) -> dict[int, list[Action]]:
    """Interleaved 1F1B (Megatron-LM): ``chunks`` looped stages per rank, micro-batches in groups of ``ranks``.

    Raises:
        ScheduleError: ``chunks < 2`` (that is plain 1F1B) or ``microbatches`` not a multiple of ``ranks``.
    """
    check_shape(ranks, microbatches, chunks)
    if chunks < 2:
        raise ScheduleError(f"interleaved needs chunks >= 2 stages per rank, got chunks={chunks}; use '1f1b'")
    if microbatches % ranks:
        raise ScheduleError(
            f"interleaved needs microbatches to be a multiple of ranks={ranks}, got microbatches={microbatches}"
        )
    total = microbatches * chunks
    group = ranks * chunks

    def order(k: int, *, backward: bool) -> tuple[int, int]:
        chunk = (k // ranks) % chunks
        if backward:
            chunk = chunks - 1 - chunk
        return chunk, (k // group) * ranks + k % ranks

    out: dict[int, list[Action]] = {}
    for rank in range(ranks):
        # fill every chunk but the last for one group of micro-batches, plus the round trip to the last rank,
        # so that the steady state's first backward finds its gradient on the way (Megatron-LM's warm-up)
        warmup = min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, total)
        acts: list[Action] = []
        for k in range(warmup):
            chunk, mb = order(k, backward=False)
            acts.append(Action(chunk * ranks + rank, FWD, mb))
        for j in range(total - warmup):
            chunk, mb = order(warmup + j, backward=False)
            acts.append(Action(chunk * ranks + rank, FWD, mb))
            chunk, mb = order(j, backward=True)
            acts.append(Action(chunk * ranks + rank, BWD, mb))
        for j in range(max(total - warmup, 0), total):
            chunk, mb = order(j, backward=True)
            acts.append(Action(chunk * ranks + rank, BWD, mb))
        out[rank] = acts
    return out


#: Registry of generator names (the CLI's ``--kind``) -> generator.
GENERATORS: dict[str, ScheduleGenerator] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved_1f1b,
    "zb1p": zb_h1,
}


def generate(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Generate a schedule of ``kind`` for ``ranks`` pipeline ranks with ``chunks`` stages each.

    Args:
        kind: a name in :data:`GENERATORS` ("gpipe", "1f1b", "interleaved", "zb1p").
        ranks: pipeline ranks (devices), >= 1.
        microbatches: micro-batches per step, >= 1.
        chunks: stages per rank (``ranks * chunks`` stages, stage ``s`` on rank ``s % ranks``).

    Raises:
        ScheduleError: unknown kind (the message lists the valid ones), or parameters the generator refuses.
    """
    check_shape(ranks, microbatches, chunks)
    try:
        generator: Callable[[int, int, int], dict[int, list[Action]]] = GENERATORS[CHECK.str("kind", kind)]
    except KeyError:
        raise ScheduleError(f"unknown schedule kind {kind!r}: expected one of {', '.join(GENERATORS)}") from None
    actions = generator(ranks, microbatches, chunks)
    return Schedule(
        kind=kind,
        num_ranks=ranks,
        num_stages=ranks * chunks,
        microbatches=microbatches,
        actions={r: tuple(a) for r, a in actions.items()},
    )
