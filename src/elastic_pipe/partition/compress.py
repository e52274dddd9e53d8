"""Pipeline compression: the smallest pipeline length that still fits once a prefix is frozen.

Two rules:

* :func:`compress_halving`, as published in PipeTransformer (section 3.2): the frozen prefix leaves the pipeline;
  while ``K >= 2``, partition the active layers over ``K/2`` devices (with the ``greedy`` rule unless told
  otherwise); if that partition's largest device is within the budget (``M0``, the largest device of the
  partition at the start, nothing frozen) halve ``K`` and repeat, else stop.
* :func:`compress_memory`: the smallest ``K`` dividing the device count (not only powers of two) whose optimal
  partition of the per-layer training memory fits a per-device memory budget. Pipeline lengths that divide the
  device count keep every device busy as ``devices / K`` replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elastic_pipe.partition._checks import MAX_DEVICES, check_costs
from elastic_pipe.partition.errors import CHECK, PartitionError
from elastic_pipe.partition.registry import Solver, solve
from elastic_pipe.partition.result import Partition

__all__ = ["Compression", "compress_halving", "compress_memory", "divisors", "initial_budget"]


@dataclass(frozen=True, slots=True)
class Compression:
    """The outcome of a compression rule.

    Attributes:
        pipe_len: the chosen pipeline length K.
        partition: the active layers partitioned over ``pipe_len`` stages.
        tried: ``(K, bottleneck)`` for every pipeline length the rule evaluated, in order.
        rule: ``"halving"`` or ``"memory"``.
    """

    pipe_len: int
    partition: Partition
    tried: tuple[tuple[int, float], ...] = ()
    rule: str = ""

    def __post_init__(self) -> None:
        if self.pipe_len != self.partition.num_stages:
            raise PartitionError(
                f"Compression.pipe_len={self.pipe_len} but the partition has {self.partition.num_stages} stages"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's output keys)."""
        return {
            "rule": self.rule,
            "pipe_len": self.pipe_len,
            "partition": self.partition.to_dict(),
            "tried": [{"pipe_len": k, "bottleneck": b} for k, b in self.tried],
        }


def _check_budget(budget: float) -> float:
    """The budget as a float >= 0 (infinity allowed: no limit)."""
    return CHECK.float("budget", budget, finite=False)


def _check_count(name: str, value: int) -> int:
    return CHECK.int(name, value, lo=1, hi=MAX_DEVICES)


def compress_halving(
    sizes: Sequence[float],
    from_stages: int,
    budget: float,
    solver: str | Solver = "greedy",
    **options: Any,
) -> Compression:
    """The published halving rule.

    Args:
        sizes: per-layer sizes of the ACTIVE layers (the frozen prefix has left the pipeline), in the unit of
            ``budget``; parameter counts as published.
        from_stages: the current pipeline length K.
        budget: the largest per-device size allowed, ``M0`` as published (the largest device of the partition
            at the start, in the same unit as ``sizes``).
        solver: the solver used at each candidate length (``greedy`` as published).
        **options: passed to the solver (e.g. ``unit`` for ``greedy``).

    Returns:
        The compression; ``tried`` lists every halved length evaluated. A length longer than the number of
        active layers cannot be built, so it is halved without a check.

    Raises:
        PartitionError: on bad sizes, ``from_stages < 1`` or a negative/NaN budget.
    """
    values = check_costs(sizes, "sizes")
    k = _check_count("from_stages", from_stages)
    limit = _check_budget(budget)
    tried: list[tuple[int, float]] = []
    while k > len(values):
        k //= 2
    while k >= 2:
        candidate = solve(values, k // 2, solver, **options)
        tried.append((k // 2, candidate.bottleneck))
        if candidate.bottleneck <= limit:
            k //= 2
        else:
            break
    return Compression(pipe_len=k, partition=solve(values, k, solver, **options), tried=tuple(tried), rule="halving")


#: The largest number :func:`divisors` factors: a million trial divisions, well under a second.
MAX_DIVIDEND = 2**40


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (``1 <= n <= 2**40``: the search takes up to ``sqrt(n)`` steps)."""
    CHECK.int("n", n, lo=1, hi=MAX_DIVIDEND)
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def compress_memory(
    memory: Sequence[float],
    devices: int,
    budget: float,
    solver: str | Solver = "optimal",
    **options: Any,
) -> Compression:
    """The smallest pipeline length dividing ``devices`` whose partition fits ``budget`` per device.

    Args:
        memory: per-layer training memory of the active layers (bytes, or any unit shared with ``budget``).
        devices: the device count the pipeline lengths must divide (a pipeline's length times its replicas).
        budget: memory available per device.
        solver: the solver used at each candidate length (``optimal``: a length fits iff some partition fits).
        **options: passed to the solver.

    Returns:
        The compression; ``tried`` lists the lengths evaluated, shortest first.

    Raises:
        PartitionError: on bad input, or when no divisor of ``devices`` (up to the number of layers) fits.
    """
    values = check_costs(memory, "memory")
    count = _check_count("devices", devices)
    limit = _check_budget(budget)
    tried: list[tuple[int, float]] = []
    for k in divisors(count):
        if k > len(values):
            break
        candidate = solve(values, k, solver, **options)
        tried.append((k, candidate.bottleneck))
        if candidate.bottleneck <= limit:
            return Compression(pipe_len=k, partition=candidate, tried=tuple(tried), rule="memory")
    best = min(b for _, b in tried)
    raise PartitionError(
        f"no pipeline length dividing {count} devices fits budget={limit:g}: the best, "
        f"{min(tried, key=lambda t: t[1])[0]} stages, needs {best:g} per device"
    )


def initial_budget(sizes: Sequence[float], stages: int, solver: str = "greedy", **options: Any) -> float:
    """``M0`` for :func:`compress_halving`: the largest device of the partition at the start (nothing frozen).

    Args:
        sizes: per-layer sizes of the whole model.
        stages: the initial pipeline length.
        solver: the solver (``greedy`` as published).
        **options: passed to the solver.
    """
    return solve(check_costs(sizes, "sizes"), stages, solver, **options).bottleneck
