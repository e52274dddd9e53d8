"""Checking the data before the first step: every item fits item 0, every class label fits the model's output, and
(``[data] check``) no input or label holds NaN or infinity.

A bad item found only when a step reads it would fail one rank in the middle of a collective, and the others would
wait for the timeout. So at setup each rank checks a share of the items (a dataset: ``[data] check``; tensors in
memory: their labels, at once), the ranks exchange what they found on the control group, and every rank raises the
same :class:`~elastic_pipe.orchestrator.errors.ConfigError`, naming the first bad sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from elastic_pipe.orchestrator.data.items import nonfinite_problem
from elastic_pipe.orchestrator.data.workload import Split
from elastic_pipe.orchestrator.errors import ConfigError

if TYPE_CHECKING:  # a dataset's part is only told apart from a Split here, never built
    from elastic_pipe.orchestrator.data.dataset_split import Part

__all__ = ["local_failure", "raise_first_failure"]


def first_bad_label(split: Split, classes: int) -> tuple[int, str] | None:
    """The first sample of ``split`` (by id) with an integer label outside ``[0, classes)``, and why."""
    labels = split.labels
    if labels.is_floating_point() or labels.numel() == 0:
        return None
    rows = labels.reshape(labels.shape[0], -1)
    bad = ((rows < 0) | (rows >= classes)).any(dim=1)
    if not bool(bad.any()):
        return None
    ids = split.sample_ids[bad.to(split.sample_ids.device)]
    first = int(ids.min())
    row = rows[(split.sample_ids == first).nonzero()[0, 0].to(rows.device)]
    value = int(row[(row < 0) | (row >= classes)][0])
    return first, f"dataset item {first}: label {value} is out of range [0, {classes})"


def first_nonfinite(split: Split) -> tuple[int, str] | None:
    """The first sample of ``split`` (by id) whose floating-point input or label holds NaN or infinity, and why."""
    bad: torch.Tensor | None = None
    for t in (split.inputs, split.labels):
        if t.is_floating_point() and t.numel():
            rows = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(dim=1)
            bad = rows if bad is None else bad | rows.to(bad.device)
    if bad is None or not bool(bad.any()):
        return None
    first = int(split.sample_ids[bad.to(split.sample_ids.device)].min())
    row = int((split.sample_ids == first).nonzero()[0, 0])
    return first, str(nonfinite_problem(first, split.inputs[row], split.labels[row]))


def local_failure(parts: Sequence[Part], classes: int | None, rank: int, world_size: int, scan: bool) -> str:
    """This rank's share of the check: the first failure as ``"index:reason"``, or ``""``."""
    found: list[tuple[int, str]] = []
    for part in parts:
        failure: tuple[int, str] | None = None
        if isinstance(part, Split):
            if rank == 0:
                failure = first_bad_label(part, classes) if classes is not None else None
                if scan:  # [data] check: no NaN or infinity in tensors in memory either
                    nonfinite = first_nonfinite(part)
                    failure = (
                        nonfinite if failure is None else failure if nonfinite is None else min(failure, nonfinite)
                    )
        elif scan:  # a dataset's part: each rank reads its share of the items
            failure = part.first_bad_item(rank, world_size)
        if failure is not None:
            found.append(failure)
    if not found:
        return ""
    index, reason = min(found)
    return f"{index}:{reason}"


def raise_first_failure(mine: str, rank: int, world_size: int, broadcast: Callable[[bytes | None, int], bytes]) -> None:
    """Exchange every rank's failure (a collective on the control group) and raise the first, on every rank.

    Raises:
        ConfigError: the failure with the smallest sample index any rank found.
    """
    failures = []
    for src in range(world_size):
        text = broadcast(mine.encode() if rank == src else None, src).decode()
        if text:
            index, _, reason = text.partition(":")
            failures.append((int(index), reason))
    if failures:
        raise ConfigError(min(failures)[1])
