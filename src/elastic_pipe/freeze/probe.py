"""How much each layer's output on a fixed probe batch changed since the previous decision point.

The representation-drift signal of :class:`~elastic_pipe.freeze.Drift`. At every decision point the runtime runs a
fixed batch of training samples (the *probe*) through the model in eval mode (no dropout, so only the weights can
change the result) and hands each watched layer's output to :class:`OutputDrift`, which keeps it until the next
decision point and returns, per layer, the squared distance to the previous output and that previous output's
squared norm. Squares of disjoint pieces add, so the pieces of different pipeline stages (each holds the layers
whose output it computes; zeros elsewhere) merge with one sum - an all-reduce - and :func:`relative_change` turns the
merged sums into the numbers the policy reads::

    change_l(t) = ||H_l(t) - H_l(t-1)||_F / ||H_l(t-1)||_F        H_l: layer l's output on the probe batch

The output of layer ``l`` depends on the layers below it too, so ``change_l`` is the drift of the whole prefix
``0..l`` - exactly what freezing that prefix (and caching its output) stops.

A policy reads the drift through an optional capability, declared here as a protocol (:class:`ProbePolicy`) rather
than found by attribute lookups at the call site.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from elastic_pipe.freeze.errors import CHECK, FreezeError

__all__ = ["OutputDrift", "ProbePolicy", "relative_change"]


@runtime_checkable
class ProbePolicy(Protocol):
    """The optional capability of a freeze policy that reads the probe's output drift (:class:`~elastic_pipe.freeze.
    Drift` has it; any object with these members does, no base class needed).

    A runtime runs the probe batch at each decision point for a policy whose ``needs_probe`` is true
    (:func:`~elastic_pipe.freeze.needs_probe`) and hands the merged :func:`relative_change` to
    :meth:`observe_drift` before it asks the policy to propose.
    """

    #: The runtime measures the probe for this policy (False: the member is there but unused).
    needs_probe: bool

    def observe_drift(self, change: Sequence[float]) -> None:
        """Per freeze unit, the relative change of its output on the probe batch since the previous decision point."""
        ...


def relative_change(diff_sq: Sequence[float], ref_sq: Sequence[float]) -> tuple[float, ...]:
    """Per layer ``sqrt(diff_sq / ref_sq)``: the relative change of an output (0 where both are 0).

    Args:
        diff_sq: per layer, ``||H(t) - H(t-1)||^2`` summed over the pieces that hold it.
        ref_sq: per layer, ``||H(t-1)||^2`` summed likewise.

    Returns:
        The relative changes, each >= 0: ``inf`` where the previous output was all zeros and the current one is
        not (or where :meth:`OutputDrift.measure` had nothing to compare with), which no threshold accepts as quiet.

    Raises:
        FreezeError: lengths differ, or a value is negative or not a number.
    """
    diff_sq = [CHECK.number(f"relative_change: diff_sq[{i}]", d) for i, d in enumerate(CHECK.items("diff_sq", diff_sq))]
    ref_sq = [CHECK.number(f"relative_change: ref_sq[{i}]", r) for i, r in enumerate(CHECK.items("ref_sq", ref_sq))]
    if len(diff_sq) != len(ref_sq):
        raise FreezeError(f"relative_change: {len(diff_sq)} distances but {len(ref_sq)} reference norms")
    out = []
    for i, (d, r) in enumerate(zip(diff_sq, ref_sq, strict=True)):
        if math.isnan(d) or math.isnan(r) or d < 0 or r < 0:
            raise FreezeError(
                f"relative_change: layer {i} has distance {d!r} and norm {r!r} (diff_sq[{i}], ref_sq[{i}]); expected "
                "numbers >= 0"
            )
        if r > 0:
            out.append(math.sqrt(d / r))
        else:
            out.append(0.0 if d == 0 else math.inf)
    return tuple(out)


class OutputDrift:
    """Each watched layer's probe output at the previous decision point, and its change since (one rank's piece).

    Example::

        drift = OutputDrift()
        outputs = {l: h for l, h in enumerate(block_outputs(model, probe))}   # at a decision point, eval mode
        diff_sq, ref_sq = drift.measure(outputs, num_layers=12)              # sum these over the stages
        change = relative_change(diff_sq, ref_sq)                             # then hand it to the policy
    """

    def __init__(self) -> None:
        self._prev: dict[int, torch.Tensor] = {}

    @property
    def held(self) -> tuple[int, ...]:
        """The layers whose previous output is kept, ascending."""
        return tuple(sorted(self._prev))

    @torch.no_grad()
    def measure(
        self, outputs: Mapping[int, torch.Tensor], num_layers: int
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Compare ``outputs`` with the previous ones and keep them for the next decision point.

        Args:
            outputs: global layer index -> the layer's output on the probe batch now (any shape; the previous one
                of the same layer must have the same shape). Layers left out are forgotten (a frozen layer).
            num_layers: the length of the result.

        Returns:
            ``(diff_sq, ref_sq)`` per layer, read from the device with one transfer: zeros for layers not in
            ``outputs`` (another piece holds them, or none does), and ``(inf, 0)`` - a change no threshold accepts -
            for a layer seen for the first time, which has nothing to be compared with yet.

        Raises:
            FreezeError: a layer index outside ``[0, num_layers)``, or an output whose shape changed.
        """
        for index, h in outputs.items():
            if not 0 <= index < num_layers:
                raise FreezeError(f"OutputDrift.measure: layer {index} outside [0, {num_layers})")
            old = self._prev.get(index)
            if old is not None and old.shape != h.shape:
                raise FreezeError(
                    f"OutputDrift.measure: layer {index}'s output has shape {tuple(h.shape)}, "
                    f"expected {tuple(old.shape)} as at the previous decision point"
                )
        diff_sq, ref_sq = [0.0] * num_layers, [0.0] * num_layers
        for i in outputs:
            if i not in self._prev:
                diff_sq[i] = math.inf
        # One stacked reduction per kind of output (a transformer's blocks share one shape): a few kernel launches
        # per decision point instead of several per layer. The stack of the new outputs is also their kept copy.
        groups: dict[tuple[object, ...], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        for i, h in sorted(outputs.items()):
            old = self._prev.get(i)
            if old is not None:
                groups.setdefault((h.shape, h.dtype, old.dtype, h.device), []).append((i, old, h.detach()))
        kept: dict[int, torch.Tensor] = {}
        order: list[int] = []
        diffs: list[torch.Tensor] = []
        refs: list[torch.Tensor] = []
        for members in groups.values():
            now = torch.stack([h for _, _, h in members])
            before = torch.stack([old for _, old, _ in members]).float()
            diffs.append((now.float() - before).square().reshape(len(members), -1).sum(1))
            refs.append(before.square().reshape(len(members), -1).sum(1))
            for k, (i, _, _) in enumerate(members):
                kept[i] = now[k]
                order.append(i)
        self._prev = {i: kept[i] if i in kept else h.detach().clone() for i, h in outputs.items()}
        if order:
            values = torch.cat([*diffs, *refs]).double().tolist()
            for k, i in enumerate(order):
                diff_sq[i], ref_sq[i] = values[k], values[len(order) + k]
        return tuple(diff_sq), tuple(ref_sq)

    def reset(self) -> None:
        """Forget every kept output."""
        self._prev.clear()

    def state_dict(self) -> dict[int, torch.Tensor]:
        """The kept outputs, for a checkpoint: layer index -> a CPU copy of its output at the previous decision
        point (dtype and bits unchanged, so a restored piece measures exactly what this one would)."""
        return {i: h.detach().to("cpu", copy=True) for i, h in sorted(self._prev.items())}

    def load_state_dict(
        self,
        state: Mapping[int, torch.Tensor],
        *,
        num_layers: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """Keep ``state``'s outputs (a :meth:`state_dict`) instead of the current ones, as the baseline of the next
        :meth:`measure`.

        Args:
            state: layer index -> that layer's output at the previous decision point; ``{}`` keeps nothing.
            num_layers: when given, every index must lie in ``[0, num_layers)``.
            device: where the outputs go (the device the next outputs will be on); default: where they are.

        Raises:
            FreezeError: naming the bad entry: an index that is not an integer >= 0 (or not below ``num_layers``),
                or a value that is not a floating-point tensor. Nothing is changed then.
        """
        kept: dict[int, torch.Tensor] = {}
        for index, h in state.items():
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise FreezeError(f"OutputDrift.load_state_dict: layer index {index!r} is not an integer >= 0")
            if num_layers is not None and index >= num_layers:
                raise FreezeError(f"OutputDrift.load_state_dict: layer {index} outside [0, {num_layers})")
            if not isinstance(h, torch.Tensor) or not h.is_floating_point():
                what = f"a {h.dtype} tensor" if isinstance(h, torch.Tensor) else type(h).__name__
                raise FreezeError(
                    f"OutputDrift.load_state_dict: layer {index}'s output is {what}, expected a floating-point tensor"
                )
            kept[index] = h.detach().to(device if device is not None else h.device, copy=True)
        self._prev = kept
