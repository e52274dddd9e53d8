"""Accumulate per-layer gradients over an interval on whichever layers this rank holds.

The AutoFreeze rule compares the norm of the gradient *accumulated over an interval* between two intervals. The
public PipeTransformer copy of that rule read a single step's gradient instead of a sum, so its "change rate" was
step-to-step noise. This tracker keeps a running float32 sum of every held layer's gradient (one extra copy of the
active held gradients in memory) and turns it into L1 and L2 norms on demand.

Cost. A step adds its gradients to the sums with *one* fused ``torch._foreach_add_`` over every held parameter (the
parameter list is taken once, at construction, so no module is walked per step) and never reads a value back:
nothing waits for the device. The norms are taken at an interval's end with two fused ``torch._foreach_norm``
calls, combined per layer on the device, and read back with one transfer (:meth:`GradNormTracker.local_stats`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from elastic_pipe.freeze.errors import CHECK, FreezeError
from elastic_pipe.freeze.stats import LayerStats

__all__ = ["GradNormTracker"]


class GradNormTracker:
    """Running sums of the gradients of the layers one rank holds, keyed by global layer index.

    Call :meth:`accumulate` once per optimizer step, after ``backward`` (and after any gradient all-reduce) and
    before ``zero_grad``; call :meth:`local_stats` at the end of an interval and :meth:`reset` to start the next.
    Parameters without a gradient (frozen ones) are skipped, so a frozen layer reads 0. The layers' parameters are
    listed once, here: a tracker belongs to one set of modules (build a new one when they change).

    Args:
        layers: global layer index -> the module holding that layer's parameters on this rank. A layer split
            across ranks is listed on each of them with its local part (:func:`~elastic_pipe.freeze.merge_stats`
            recombines the parts exactly).

    Raises:
        FreezeError: a negative layer index.

    Example::

        tracker = GradNormTracker({4: model.blocks[0], 5: model.blocks[1]})  # this stage holds layers 4 and 5
        loss.backward(); tracker.accumulate(); optimizer.step(); optimizer.zero_grad()
        piece = tracker.local_stats(num_layers=12)
    """

    def __init__(self, layers: Mapping[int, nn.Module]) -> None:
        CHECK.mapping("GradNormTracker: layers", layers)
        for index, module in layers.items():
            CHECK.int("GradNormTracker: layers index", index)
            CHECK.instance(f"GradNormTracker: layers[{index}]", module, nn.Module)
        self._layers = dict(sorted(layers.items()))
        # every held parameter once (a module shared by two layers counts for the first), with its layer
        seen: set[int] = set()
        self._params: list[nn.Parameter] = []
        self._owner: list[int] = []
        for index, module in self._layers.items():
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    self._params.append(p)
                    self._owner.append(index)
        self._sums: list[torch.Tensor | None] = [None] * len(self._params)
        self._steps = 0

    @property
    def held(self) -> tuple[int, ...]:
        """Global indices of the layers this tracker watches, ascending."""
        return tuple(self._layers)

    @property
    def steps(self) -> int:
        """Number of :meth:`accumulate` calls since construction or the last :meth:`reset`."""
        return self._steps

    @torch.no_grad()
    def accumulate(self) -> None:
        """Add the current gradients of every held layer to the running sums (one step, one fused launch)."""
        self._steps += 1
        runs: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        sums = self._sums
        for j, p in enumerate(self._params):
            g = p.grad
            if g is None or not p.requires_grad:
                continue
            running = sums[j]
            if running is None:
                # float32 so that bf16/fp16 gradients do not lose the small ones over a long interval
                sums[j] = g.detach().to(torch.float32, copy=True)
            else:
                runs.append(running)
                grads.append(g.detach())
        if runs:
            torch._foreach_add_(runs, grads)

    @torch.no_grad()
    def local_stats(self, num_layers: int) -> LayerStats:
        """This rank's piece: norms of the accumulated gradients, zeros for layers it does not hold.

        Args:
            num_layers: total number of freezable layers in the model (the length of the result).

        Raises:
            FreezeError: a held layer index is ``>= num_layers``.
        """
        if self._layers and max(self._layers) >= num_layers:
            raise FreezeError(
                f"GradNormTracker holds layer {max(self._layers)} but num_layers={num_layers}; "
                f"expected held indices in [0, {num_layers})"
            )
        present = [(self._owner[j], s) for j, s in enumerate(self._sums) if s is not None]
        if not present:
            return LayerStats.zeros(num_layers, self._steps)
        tensors = [s for _, s in present]
        # per-tensor norms in one fused launch each, without float64 copies of the sums; the per-tensor norms
        # cross to the host once, where the per-layer combination (sum of L1s, root of the sum of squared L2s) is
        # done in float64 in a fixed order (a GPU's index_add_ adds with atomics, in an order that can change the
        # last bits between runs, and so a decision at a threshold)
        parts = torch.stack([torch.stack(torch._foreach_norm(tensors, order)) for order in (1, 2)]).double().cpu()
        owners = torch.tensor([i for i, _ in present], dtype=torch.int64)
        l1 = torch.zeros(num_layers, dtype=torch.float64).index_add_(0, owners, parts[0])
        l2 = torch.zeros(num_layers, dtype=torch.float64).index_add_(0, owners, parts[1].square())
        values = torch.cat([l1, l2.sqrt()]).tolist()
        return LayerStats(tuple(values[:num_layers]), tuple(values[num_layers:]), self._steps)

    def reset(self) -> None:
        """Forget the running sums and the step count (start a new interval)."""
        self._sums = [None] * len(self._params)
        self._steps = 0
