"""Measure real modules into :class:`~elastic_pipe.types.LayerCost` records.

:func:`profile_layers` runs an ordered list of sub-layers (each takes one tensor, returns one tensor) on the device
of the example input, each consuming the previous one's output, and records per layer:

* ``forward``/``backward``: median of ``repeats`` timed runs after ``warmup`` untimed ones (CUDA events on a GPU,
  ``time.perf_counter`` on the CPU), backward seeded with a ones gradient of the output's shape;
* ``frozen_forward``: the forward under ``torch.no_grad`` (what a frozen layer costs when recomputed);
* ``activation_bytes``: the output's size (what crosses a stage boundary);
* ``memory_bytes``: trainable parameters x (parameter + gradient + optimizer state bytes) plus the activations
  autograd stores for backward (counted through saved-tensor hooks, each storage once); on CUDA, the larger of
  that count and the allocator's peak growth over one forward;
* ``frozen_memory_bytes``: the parameters alone (no gradient, no optimizer state, nothing stored for backward).

Adapters that turn whole models into such lists belong to :mod:`elastic_pipe.models`; this module only measures.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from elastic_pipe.partition.errors import CHECK, PartitionError, PartitionTypeError
from elastic_pipe.types import LayerCost

__all__ = ["ADAM_STATE_BYTES_PER_BYTE", "profile_layers"]

#: Adam keeps two moments per parameter, each the parameter's size.
ADAM_STATE_BYTES_PER_BYTE = 2

#: On a fresh process, autograd's CUDA worker thread has no current context the first time cuBLAS runs there and
#: torch warns before making the primary context current itself. Harmless, and not ours to fix, so it is silenced
#: (only this message) while profiling.
_CUBLAS_CONTEXT_WARNING = "Attempting to run cuBLAS, but there was no current CUDA context"


class _Timer:
    """Times a callable with CUDA events on a GPU (which time the GPU work, not the launch), else on a CPU clock:
    wall time, or this thread's CPU time (``thread=True``)."""

    def __init__(self, device: torch.device, *, thread: bool = False) -> None:
        self.cuda = device.type == "cuda"
        self.clock = time.thread_time if thread else time.perf_counter

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            fn()
            end.record()
            end.synchronize()
            return float(begin.elapsed_time(end)) / 1e3
        start = self.clock()
        fn()
        return self.clock() - start


def _tensor_bytes(tensor: torch.Tensor) -> int:
    return int(tensor.numel() * tensor.element_size())


def _stored_activation_bytes(layer: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one forward, each storage counted once.

    Parameters are excluded: they are counted as parameters, not activations.
    """
    param_ptrs = {p.data_ptr() for p in layer.parameters()}
    seen: set[int] = set()
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in seen and ptr not in param_ptrs:
            seen.add(ptr)
            total += int(storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return total


def _as_input(value: torch.Tensor) -> torch.Tensor:
    """A fresh leaf for the next layer: floating tensors require grad so backward computes input gradients."""
    leaf = value.detach()
    if leaf.is_floating_point():
        leaf.requires_grad_(True)
    return leaf


#: The most timed (or warm-up) runs a measurement takes, and the most optimizer state per parameter byte: each
#: run executes every layer, so a larger count is a mistake that would run for hours.
MAX_REPEATS = 1_000


def profile_layers(
    layers: Sequence[tuple[str, nn.Module]],
    example_input: torch.Tensor,
    *,
    repeats: int = 5,
    warmup: int = 2,
    optimizer_state_bytes_per_byte: int = ADAM_STATE_BYTES_PER_BYTE,
    cpu_clock: Literal["wall", "thread"] = "wall",
) -> list[LayerCost]:
    """Measure each layer's time, activation size and memory, running the layers in order.

    Args:
        layers: ``(name, module)`` pairs in model order; module ``i`` takes module ``i-1``'s output. Modules must
            already be on the example input's device.
        example_input: the first layer's input for one micro-batch (its device picks CPU or CUDA).
        repeats: timed runs per measurement (the median is kept).
        warmup: untimed runs before them.
        optimizer_state_bytes_per_byte: optimizer state per byte of trainable parameter (2 for Adam, 0 for SGD).
        cpu_clock: how CPU layers are timed: ``"wall"`` (elapsed time), or ``"thread"`` (this thread's CPU time:
            the compute of a single-threaded run, which other processes on a shared machine cannot inflate;
            it misses work on torch's other threads, so set ``torch.set_num_threads(1)`` with it).

    Returns:
        One :class:`LayerCost` per layer. Parameter gradients are left as they were found.

    Raises:
        PartitionError: if ``layers`` is empty, ``repeats < 1``, ``warmup < 0``, or a layer does not return a
            single tensor.
    """
    layers = CHECK.items("layers", layers, empty=True)
    if not layers:
        raise PartitionError("layers is empty: need at least one (name, module) pair")
    for index, pair in enumerate(layers):
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], nn.Module)):
            raise PartitionTypeError(f"layers[{index}] must be a (name, module) pair, got {pair!r}")
    CHECK.instance("example_input", example_input, torch.Tensor)
    CHECK.int("repeats", repeats, lo=1, hi=MAX_REPEATS)
    CHECK.int("warmup", warmup, hi=MAX_REPEATS)
    CHECK.int("optimizer_state_bytes_per_byte", optimizer_state_bytes_per_byte, hi=MAX_REPEATS)
    if CHECK.str("cpu_clock", cpu_clock) not in ("wall", "thread"):
        raise PartitionError(f"cpu_clock must be 'wall' or 'thread', got {cpu_clock!r}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CUBLAS_CONTEXT_WARNING, category=UserWarning)
        timer = _Timer(example_input.device, thread=cpu_clock == "thread")
        return _profile(
            layers,
            example_input,
            timer=timer,
            repeats=repeats,
            warmup=warmup,
            optimizer_state_bytes_per_byte=optimizer_state_bytes_per_byte,
        )


def _profile(
    layers: Sequence[tuple[str, nn.Module]],
    example_input: torch.Tensor,
    *,
    timer: _Timer,
    repeats: int,
    warmup: int,
    optimizer_state_bytes_per_byte: int,
) -> list[LayerCost]:
    device = example_input.device
    records: list[LayerCost] = []
    x = _as_input(example_input)
    for name, layer in layers:
        grads_before = {id(p): p.grad for p in layer.parameters()}
        out = layer(x)
        if not isinstance(out, torch.Tensor):
            raise PartitionError(f"layer {name!r} returned {type(out).__name__}, expected one tensor")
        trains = out.requires_grad
        seed = torch.ones_like(out) if trains else None

        outputs: list[torch.Tensor] = []

        def forward(layer: nn.Module = layer, x: torch.Tensor = x, outputs: list[torch.Tensor] = outputs) -> None:
            outputs.append(layer(x))

        def backward(outputs: list[torch.Tensor] = outputs, seed: torch.Tensor | None = seed) -> None:
            torch.autograd.backward(outputs.pop(), seed)

        def frozen_forward(layer: nn.Module = layer, x: torch.Tensor = x) -> None:
            with torch.no_grad():
                layer(x)

        forward_times: list[float] = []
        backward_times: list[float] = []
        frozen_times: list[float] = []
        for run in range(warmup + repeats):
            t_forward = timer(forward)
            t_backward = timer(backward) if trains else 0.0
            outputs.clear()
            t_frozen = timer(frozen_forward)
            if run >= warmup:
                forward_times.append(t_forward)
                backward_times.append(t_backward)
                frozen_times.append(t_frozen)

        stored = _stored_activation_bytes(layer, x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            kept = layer(x)
            torch.cuda.synchronize(device)
            stored = max(stored, torch.cuda.max_memory_allocated(device) - base - _tensor_bytes(kept))
            del kept

        trainable = sum(_tensor_bytes(p) for p in layer.parameters() if p.requires_grad)
        all_params = sum(_tensor_bytes(p) for p in layer.parameters())
        per_trainable = 2 + optimizer_state_bytes_per_byte  # the parameter, its gradient, optimizer state
        for p in layer.parameters():
            p.grad = grads_before[id(p)]
        records.append(
            LayerCost(
                name=name,
                params=sum(p.numel() for p in layer.parameters()),
                forward=statistics.median(forward_times),
                backward=statistics.median(backward_times),
                activation_bytes=_tensor_bytes(out),
                memory_bytes=trainable * per_trainable + (all_params - trainable) + max(stored, 0),
                frozen_forward=statistics.median(frozen_times),
                frozen_memory_bytes=all_params,
            )
        )
        x = _as_input(out)
    return records
