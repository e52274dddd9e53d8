"""Plain types shared by the primitives.

This is the only module that the primitive packages (``freeze``, ``partition``, ``schedule``, ``groups``,
``protocol``, ``cache``, ``data``, ``models``) may import from each other's neighbourhood. It holds data, not
behaviour: frozen dataclasses and the root of the exception hierarchy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ElasticPipeError", "LayerCost", "Layout"]


class ElasticPipeError(Exception):
    """Root of every exception elastic_pipe raises on purpose.

    Each package derives its own family from this one (and usually from ``ValueError`` too), so callers can
    catch a whole package's errors or all of the toolkit's at once. The CLI turns any of them into one line on
    stderr and exit code 2.
    """


def _check_non_negative(owner: str, **values: float) -> None:
    for key, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise ElasticPipeError(f"{owner}.{key} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class LayerCost:
    """What one partitionable layer (or sub-layer) costs.

    Times are seconds per micro-batch, sizes are bytes, ``params`` is a parameter count. Every field but
    ``name`` defaults to 0 so that callers fill in only what they know.

    Attributes:
        name: a human-readable name, e.g. ``"block3.attn"``.
        params: number of parameters.
        forward: forward time (s) for one micro-batch.
        backward: backward time (s) for one micro-batch (input and weight gradients together).
        activation_bytes: bytes of the layer's output for one micro-batch (what crosses a stage boundary).
        memory_bytes: training memory while active: parameters, gradients, optimizer state and stored
            activations for one micro-batch.
        frozen_forward: measured forward time (s) when frozen (``no_grad``); ``None`` means "not measured".
        frozen_memory_bytes: measured memory when frozen; ``None`` means "not measured".
    """

    name: str
    params: int = 0
    forward: float = 0.0
    backward: float = 0.0
    activation_bytes: int = 0
    memory_bytes: int = 0
    frozen_forward: float | None = None
    frozen_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_non_negative(
            f"LayerCost({self.name!r})",
            params=self.params,
            forward=self.forward,
            backward=self.backward,
            activation_bytes=self.activation_bytes,
            memory_bytes=self.memory_bytes,
        )
        if self.frozen_forward is not None:
            _check_non_negative(f"LayerCost({self.name!r})", frozen_forward=self.frozen_forward)
        if self.frozen_memory_bytes is not None:
            _check_non_negative(f"LayerCost({self.name!r})", frozen_memory_bytes=self.frozen_memory_bytes)

    @property
    def train_time(self) -> float:
        """Forward plus backward time (s) of one micro-batch while the layer is active."""
        return self.forward + self.backward


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a job stands: how many leading layers are frozen and how the active ones are laid out.

    Attributes:
        frozen: number of frozen leading layers.
        pipe_len: pipeline length K (stages per pipeline replica).
        replicas: number of data-parallel pipeline replicas (world size / K in the SPMD layout).
        boundaries: K + 1 layer indices; stage ``s`` holds active layers ``boundaries[s]:boundaries[s+1]``
            (indices count from the first layer of the model, so ``boundaries[0] == frozen``).
        microbatches: micro-batches per step and replica.
    """

    frozen: int
    pipe_len: int
    replicas: int
    boundaries: tuple[int, ...]
    microbatches: int

    def __post_init__(self) -> None:
        if self.frozen < 0 or self.pipe_len < 1 or self.replicas < 1 or self.microbatches < 1:
            raise ElasticPipeError(
                f"Layout needs frozen >= 0, pipe_len >= 1, replicas >= 1, microbatches >= 1; got {self!r}"
            )
        if len(self.boundaries) != self.pipe_len + 1:
            raise ElasticPipeError(
                f"Layout.boundaries needs pipe_len + 1 = {self.pipe_len + 1} entries, got {self.boundaries!r}"
            )
        if self.boundaries[0] != self.frozen or any(
            b >= c for b, c in zip(self.boundaries, self.boundaries[1:], strict=False)
        ):
            raise ElasticPipeError(
                f"Layout.boundaries must start at frozen={self.frozen} and strictly increase, got {self.boundaries!r}"
            )

    @property
    def world_size(self) -> int:
        """Devices the layout occupies: pipeline length times replicas."""
        return self.pipe_len * self.replicas

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Number of active layers on each stage."""
        return tuple(c - b for b, c in zip(self.boundaries, self.boundaries[1:], strict=False))
