"""The steps of an epoch: how many, of what size, and which samples each replica reads in each.

Epoch length (:func:`epoch_plan`). Every step but the last takes ``global_batch`` samples. The ``N mod B`` left
over form one short last step of the largest multiple of the *split unit* that fits (the unit: the least common
multiple of ``replicas x microbatches`` over every layout the job can reach, so that the short step splits into
equal micro-batches on every replica, whatever the layout, and the number of steps per epoch never depends on the
layout); the fewer than ``unit`` samples left after it are dropped this epoch and counted (``dropped`` in the
epoch record; a different random tail every epoch). ``[data] drop_last = true`` keeps whole steps only and drops
the ``N mod B`` rest instead.

A step's indices come from the :class:`~elastic_pipe.data.ElasticSampler` through :class:`ElasticBatchSampler`,
which walks a snapshot of the sampler (a loader's workers read ahead of the training loop; the sampler itself
advances only when a step is done). A new layout builds a new batch sampler from the sampler's position, so the
position survives a re-shard.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastic_pipe import data as edata

__all__ = ["ElasticBatchSampler", "EpochPlan", "epoch_plan", "reachable_pipe_lens", "split_unit"]


def reachable_pipe_lens(pipe_len: int, world_size: int) -> tuple[int, ...]:
    """Every pipeline length a job may reach: divisors of the world size up to the initial length, longest first."""
    return tuple(k for k in range(pipe_len, 0, -1) if world_size % k == 0)


def split_unit(world_size: int, pipe_lens: Sequence[int], microbatches_for: Callable[[int], int]) -> int:
    """The least common multiple of ``replicas x microbatches`` over the reachable pipeline lengths.

    A step of a multiple of it splits into equal micro-batches on every replica of every reachable layout.
    """
    return math.lcm(*(world_size // k * microbatches_for(k) for k in pipe_lens))


@dataclass(frozen=True)
class EpochPlan:
    """How one epoch of ``samples`` training samples is cut into steps.

    Attributes:
        samples: training samples.
        batch: the global batch of a full step.
        last: samples of the short last step (0: none).
        dropped: samples left out every epoch (the last of the epoch's order).
    """

    samples: int
    batch: int
    last: int
    dropped: int

    @property
    def full_steps(self) -> int:
        """Steps of ``batch`` samples."""
        return self.samples // self.batch

    @property
    def steps(self) -> int:
        """Steps per epoch, the short one included."""
        return self.full_steps + (1 if self.last else 0)

    @property
    def used(self) -> int:
        """Samples each epoch trains on."""
        return self.samples - self.dropped

    def size(self, step: int) -> int:
        """Samples (over all replicas) of step ``step`` (0-based) of the epoch."""
        return self.batch if step < self.full_steps else self.last

    def sizes(self, first: int = 0) -> list[int]:
        """The sizes of steps ``first, first + 1, ...`` to the epoch's end."""
        return [self.size(i) for i in range(first, self.steps)]

    def steps_done(self, consumed: int) -> int:
        """Steps done when the sampler has used ``consumed`` positions of the epoch."""
        return -(-consumed // self.batch)


def epoch_plan(samples: int, batch: int, unit: int, *, drop_last: bool = False) -> EpochPlan:
    """Cut ``samples`` into steps of ``batch``, then (unless ``drop_last``) one short step of a multiple of ``unit``.

    Args:
        samples: training samples.
        batch: the global batch, a multiple of ``unit``.
        unit: the split unit (:func:`split_unit`).
        drop_last: no short step: the ``samples mod batch`` rest is dropped.
    """
    assert batch % unit == 0, (batch, unit)
    rest = samples % batch
    last = 0 if drop_last else rest - rest % unit
    return EpochPlan(samples, batch, last, rest - last)


class ElasticBatchSampler:
    """A batch sampler over the rest of an epoch: per step, this replica's indices from the elastic sampler.

    It walks a copy of ``sampler`` (``step_indices`` then ``advance``), so iterating it never moves the sampler the
    training loop advances; build a new one after a re-shard.

    Args:
        sampler: the job's sampler, at its current position and sharding.
        sizes: the global size of each remaining step.
    """

    def __init__(self, sampler: edata.ElasticSampler, sizes: Sequence[int]) -> None:
        self.sampler = sampler
        self.sizes = list(sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self) -> Iterator[list[int]]:
        walker = copy.copy(self.sampler)
        for size in self.sizes:
            yield walker.step_indices(size)
            walker.advance(size)
