"""Schedule generators: GPipe, 1F1B, interleaved 1F1B and zero-bubble ZB-H1, plus the registry.

Each generator is a pure function ``(ranks, microbatches, chunks) -> {rank: [Action, ...]}``; ``chunks`` is the
number of stages per rank (``ranks * chunks`` stages in all, stage ``s`` on rank ``s % ranks``, the looped
placement of torch's interleaved schedules). A generator refuses parameters it cannot schedule with a
:class:`ScheduleError` naming the constraint; :func:`refusal` gives that reason (``None`` where it runs) without
building the schedule, and each generator refuses with it, so the answer and the generator cannot disagree.
Timelines below: 4 ranks, 4 micro-batches, equal costs, B = 2F.

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
    "MAX_AUTO_VIRTUAL",
    "ScheduleGenerator",
    "accepts",
    "generate",
    "gpipe",
    "interleaved_1f1b",
    "one_f_one_b",
    "refusal",
    "zb_h1",
]

FWD, BWD, IGRAD, WGRAD = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W

#: The most actions a generator builds (``ranks * chunks * microbatches`` stage-micro-batch pairs, up to three
#: actions each): about a million, seconds of pure Python (1F1B with 128 ranks and 1024 micro-batches, 262k
#: actions, takes 2-4 s on a busy 2-core machine); the CLI keeps a tighter limit because it also simulates.
MAX_ACTIONS = 2**20


#: The largest v (stages per rank) ``[pipeline] virtual = "auto"`` tries, in training's layout rule and in the
#: planner alike: beyond 4 the bubble left is small and every extra stage adds host work.
MAX_AUTO_VIRTUAL = 4


def _shape_refusal(ranks: int, microbatches: int, chunks: int) -> str | None:
    """Why any generator refuses these counts (each >= 1): one above its limit, or too many actions in all."""
    for name, value, most in (
        ("ranks", ranks, MAX_RANKS),
        ("microbatches", microbatches, MAX_MICROBATCHES),
        ("chunks", chunks, MAX_CHUNKS),
    ):
        if value > most:
            return f"{name} must be an integer <= {most}, got {value}"
    if 3 * ranks * chunks * microbatches > MAX_ACTIONS:
        return (
            f"ranks={ranks} x chunks={chunks} x microbatches={microbatches} makes up to "
            f"{3 * ranks * chunks * microbatches} actions, above the limit of {MAX_ACTIONS}"
        )
    return None


class ScheduleGenerator(Protocol):
    """A schedule generator: per-rank ordered compute actions for ``ranks * chunks`` looped stages."""

    def __call__(self, ranks: int, microbatches: int, chunks: int) -> dict[int, list[Action]]: ...


def gpipe(ranks: int, microbatches: int, chunks: int = 1) -> dict[int, list[Action]]:
    """GPipe: every forward, then every backward (micro-batches in order, as torch's ScheduleGPipe).

    With ``chunks > 1`` a rank runs its stages breadth first, the order of torch's ScheduleLoopedBFS: all forwards
    of its lowest stage, then the next stage's; backwards from its highest stage down, latest micro-batch first.
    """
    _require("gpipe", ranks, microbatches, chunks)
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
    _require("1f1b", ranks, microbatches, chunks)
    return {r: _one_f_one_b_rank(r, ranks, microbatches, split=False) for r in range(ranks)}


def zb_h1(ranks: int, microbatches: int, chunks: int = 1) -> dict[int, list[Action]]:
    """ZB-H1: 1F1B with split backwards; rank ``r`` keeps up to ``r`` weight-gradient passes pending."""
    _require("zb1p", ranks, microbatches, chunks)
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
    _require("interleaved", ranks, microbatches, chunks)
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


def _gpipe_refusal(ranks: int, microbatches: int, chunks: int) -> str | None:
    """GPipe runs any counts."""
    return None


def _one_f_one_b_refusal(ranks: int, microbatches: int, chunks: int) -> str | None:
    """1F1B holds one stage per rank."""
    if chunks != 1:
        return f"1f1b holds one stage per rank (chunks=1), got chunks={chunks}; use 'interleaved'"
    return None


def _zb_h1_refusal(ranks: int, microbatches: int, chunks: int) -> str | None:
    """ZB-H1 holds one stage per rank."""
    if chunks != 1:
        return f"zb1p (ZB-H1) holds one stage per rank (chunks=1), got chunks={chunks}"
    return None


def _interleaved_refusal(ranks: int, microbatches: int, chunks: int) -> str | None:
    """Interleaved 1F1B needs two stages per rank or more and micro-batches in whole groups of ``ranks``."""
    if chunks < 2:
        return f"interleaved needs chunks >= 2 stages per rank, got chunks={chunks}; use '1f1b'"
    if microbatches % ranks:
        return f"interleaved needs microbatches to be a multiple of ranks={ranks}, got microbatches={microbatches}"
    return None


#: Per kind of :data:`GENERATORS`, what its generator refuses beyond the limits every generator keeps.
_KIND_REFUSALS: dict[str, Callable[[int, int, int], str | None]] = {
    "gpipe": _gpipe_refusal,
    "1f1b": _one_f_one_b_refusal,
    "interleaved": _interleaved_refusal,
    "zb1p": _zb_h1_refusal,
}


def refusal(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> str | None:
    """Why :func:`generate` refuses ``kind`` on ``ranks`` ranks with ``microbatches`` micro-batches and ``chunks``
    stages per rank (the one-line message it raises), or ``None`` when it builds the schedule; decided from the
    counts alone, without building it.

    Every generator refuses with this reason, so ``refusal(...) is None`` exactly when ``generate(...)`` returns: a
    kind's own constraint (``1f1b``/``zb1p`` one stage per rank, ``interleaved`` two or more and micro-batches a
    multiple of ``ranks``), a count above its limit (:data:`~elastic_pipe.schedule.ir.MAX_RANKS`,
    ``MAX_MICROBATCHES``, :data:`~elastic_pipe.schedule.MAX_CHUNKS`) or more than :data:`MAX_ACTIONS` actions.

    Raises:
        ScheduleError: an unknown kind (the message lists the valid ones), or a count below 1.
        ScheduleTypeError: a kind that is not a string, or a count that is not an int.
    """
    if CHECK.str("kind", kind) not in GENERATORS:
        raise ScheduleError(f"unknown schedule kind {kind!r}: expected one of {', '.join(GENERATORS)}")
    ranks = CHECK.int("ranks", ranks, lo=1)
    microbatches = CHECK.int("microbatches", microbatches, lo=1)
    chunks = CHECK.int("chunks", chunks, lo=1)
    return _shape_refusal(ranks, microbatches, chunks) or _KIND_REFUSALS[kind](ranks, microbatches, chunks)


def accepts(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> bool:
    """Whether :func:`generate` builds ``kind`` for these counts (:func:`refusal` gives no reason; it raises as
    :func:`refusal` does)."""
    return refusal(kind, ranks, microbatches, chunks) is None


def _require(kind: str, ranks: int, microbatches: int, chunks: int) -> None:
    """Raise :class:`ScheduleError` with :func:`refusal`'s reason, if it gives one."""
    reason = refusal(kind, ranks, microbatches, chunks)
    if reason is not None:
        raise ScheduleError(reason)


def generate(kind: str, ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    """Generate a schedule of ``kind`` for ``ranks`` pipeline ranks with ``chunks`` stages each.

    Args:
        kind: a name in :data:`GENERATORS` ("gpipe", "1f1b", "interleaved", "zb1p").
        ranks: pipeline ranks (devices), >= 1.
        microbatches: micro-batches per step, >= 1.
        chunks: stages per rank (``ranks * chunks`` stages, stage ``s`` on rank ``s % ranks``).

    Raises:
        ScheduleError: unknown kind (the message lists the valid ones), or parameters the generator refuses
            (:func:`refusal`'s reason).
    """
    _require(kind, ranks, microbatches, chunks)
    generator: Callable[[int, int, int], dict[int, list[Action]]] = GENERATORS[kind]
    actions = generator(ranks, microbatches, chunks)
    return Schedule(
        kind=kind,
        num_ranks=ranks,
        num_stages=ranks * chunks,
        microbatches=microbatches,
        actions={r: tuple(a) for r, a in actions.items()},
    )
