"""Per-step gradient averaging over a replica group: bucketed all-reduces, as DDP does them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["GRAD_BUCKET_BYTES", "average_gradients", "grad_buckets"]

#: Gradients are averaged in buckets of at most this many bytes (the size DDP uses by default).
GRAD_BUCKET_BYTES = 25 * 1024 * 1024


def grad_buckets(tensors: Sequence[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of same-dtype tensors of at most ``cap_bytes`` (a tensor larger than the cap goes alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if out and out[-1][0].dtype == t.dtype and size + nbytes <= cap_bytes:
            out[-1].append(t)
            size += nbytes
        else:
            out.append([t])
            size = nbytes
    return out


def average_gradients(
    grads: Sequence[torch.Tensor], *, group: dist.ProcessGroup, replicas: int, cap_bytes: int = GRAD_BUCKET_BYTES
) -> int:
    """Replace every gradient by its mean over ``group`` (in place, one all-reduce per bucket).

    Args:
        grads: this rank's gradients, in the same order on every rank of ``group``.
        group: the replica group of this rank's stage.
        replicas: the size of ``group`` (the divisor of the sum).
        cap_bytes: the bucket size (:func:`grad_buckets`).

    Returns:
        The number of all-reduce calls.
    """
    ops = 0
    for bucket in grad_buckets(grads, cap_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        flat.div_(replicas)
        offset = 0
        for g in bucket:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        ops += 1
    return ops
