"""Per-step gradient averaging over a replica group: bucketed all-reduces, as DDP does them - overlapped with the
backward pass when each parameter's gradient is final after one accumulation, after the step otherwise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

__all__: list[str] = []  # internal: the package face exports what others use

#: A tensor kind that :func:`grad_buckets` hands back as it got it (gradients, or the parameters that hold them).
TensorT = TypeVar("TensorT", bound=torch.Tensor)

#: Gradients are averaged in buckets of at most this many bytes (the size DDP uses by default).
GRAD_BUCKET_BYTES = 25 * 1024 * 1024


def grad_buckets(tensors: Sequence[TensorT], cap_bytes: int) -> list[list[TensorT]]:
    """Consecutive runs of same-dtype tensors of at most ``cap_bytes`` (a tensor larger than the cap goes alone)."""
    out: list[list[TensorT]] = []
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
        _write_back(flat.div_(replicas), bucket)
        ops += 1
    return ops


def _write_back(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``tensors`` (the inverse of flattening them in this order), with one
    multi-tensor copy rather than a launch per tensor."""
    pieces = torch.split(flat, [t.numel() for t in tensors])
    torch._foreach_copy_(list(tensors), [p.view_as(t) for p, t in zip(pieces, tensors, strict=True)])


def _on_grad_ready(p: torch.nn.Parameter, hook: Callable[[torch.nn.Parameter], None]) -> RemovableHandle:
    """Call ``hook(p)`` once ``p``'s gradient of a backward pass is accumulated."""
    register = cast(
        "Callable[[Callable[[torch.nn.Parameter], None]], RemovableHandle]",
        p.register_post_accumulate_grad_hook,  # untyped in torch: its documented signature
    )
    return register(hook)


class OverlappedAverager:
    """Gradient averaging that overlaps the backward pass, as ``torch.nn.parallel.DistributedDataParallel`` does.

    Parameters are bucketed in reverse order (the order the backward pass finishes them). A hook after each
    parameter's gradient accumulation marks it ready; when a bucket's last parameter is ready its gradients are
    flattened and an asynchronous all-reduce starts while the backward pass goes on. :meth:`finish`, after the
    step's backward, waits for them, divides by the replica count and writes the means back.

    Only for steps with one backward pass per parameter (one micro-batch): with several, a gradient is final only
    after the last micro-batch and the schedule rescales it afterwards; use :func:`average_gradients` there.
    Every rank of ``group`` must hold the same parameters in the same order, and its backward must reach the
    same buckets in the same order (the same model): the all-reduces are matched by order.

    Args:
        params: this rank's trainable parameters, in the same order on every rank of ``group``.
        group: the replica group of this rank's stage.
        replicas: the size of ``group``.
        cap_bytes: the bucket size.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        *,
        group: dist.ProcessGroup,
        replicas: int,
        cap_bytes: int = GRAD_BUCKET_BYTES,
    ) -> None:
        self._group = group
        self._replicas = replicas
        self._buckets = grad_buckets(list(reversed(params)), cap_bytes)
        self._bucket_of = {id(p): b for b, bucket in enumerate(self._buckets) for p in bucket}
        self._pending = [len(bucket) for bucket in self._buckets]
        self._flights: dict[int, tuple[torch.Tensor, dist.Work]] = {}
        self._handles = [_on_grad_ready(p, self._ready) for p in params]

    def _ready(self, param: torch.nn.Parameter) -> None:
        b = self._bucket_of[id(param)]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            self._launch(b)

    def _launch(self, b: int) -> None:
        grads = [p.grad for p in self._buckets[b] if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._flights[b] = (flat, dist.all_reduce(flat, group=self._group, async_op=True))

    @property
    def in_flight(self) -> int:
        """Buckets whose all-reduce has started and not been finished."""
        return len(self._flights)

    def finish(self) -> int:
        """Wait for every bucket's all-reduce (starting those the backward pass did not complete), write the means
        into the gradients, and get ready for the next step; returns the number of all-reduce calls."""
        for b in range(len(self._buckets)):
            if b not in self._flights:
                self._launch(b)
        for b, (flat, work) in sorted(self._flights.items()):
            work.wait()
            _write_back(flat.div_(self._replicas), [p.grad for p in self._buckets[b] if p.grad is not None])
        ops = len(self._flights)
        self._flights.clear()
        self._pending = [len(bucket) for bucket in self._buckets]
        return ops

    def remove(self) -> None:
        """Take the hooks off the parameters (before the layout changes)."""
        for h in self._handles:
            h.remove()
        self._handles = []
