"""Plain types shared by the primitives.

This is the only module that the primitive packages (``freeze``, ``partition``, ``schedule``, ``groups``,
``protocol``, ``cache``, ``data``, ``models``) may import from each other's neighbourhood. It holds data, not
behaviour: frozen dataclasses, the root of the exception hierarchy, the one cost fact every cost model shares
(:data:`BACKWARD_TO_FORWARD`) and the one grammar of byte sizes (:func:`parse_bytes`), which the planner, the
partition CLI, the activation cache and every config size read alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from decimal import Decimal

__all__ = [
    "BACKWARD_TO_FORWARD",
    "BYTE_UNITS",
    "MAX_BYTES",
    "MAX_DIMENSION",
    "PLACEMENT_STYLES",
    "TRANSFORMER_FAMILIES",
    "ByteSizeError",
    "ByteSizeTypeError",
    "ElasticPipeError",
    "ElasticPipeTypeError",
    "LayerCost",
    "Layout",
    "Placement",
    "TransformerShape",
    "parse_bytes",
    "stage_ranks",
]

#: A dense layer's backward costs twice its forward: it runs one matrix multiply for the input gradient and one
#: for the weight gradient, each as large as the forward's. Every analytic cost model here prices a backward
#: from its forward with this ratio (the planner's fitted factors cover the kernels it does not describe).
BACKWARD_TO_FORWARD = 2.0

#: Kinds of transformer a :class:`TransformerShape` describes: image encoder (patch embedding, class-token
#: head), bidirectional text encoder, causal text decoder.
TRANSFORMER_FAMILIES = ("vit", "bert", "gpt")
#: The largest dimension (blocks, width, sequence, vocabulary, image side) a :class:`TransformerShape` takes: no
#: model comes near it, and sizes computed from such a shape would overflow the int64 counts they feed.
MAX_DIMENSION = 2**31
#: The :class:`TransformerShape` fields that may be 0 (a family without them).
_SHAPE_OPTIONAL = ("vocab", "positions", "type_vocab", "image", "patch", "channels", "classes")


class ElasticPipeError(Exception):
    """Root of every exception elastic_pipe raises on purpose.

    Each package derives its own family from this one (and usually from ``ValueError`` too), so callers can
    catch a whole package's errors or all of the toolkit's at once. The CLI turns any of them into one line on
    stderr and exit code 2.
    """


class ElasticPipeTypeError(ElasticPipeError, TypeError):
    """An argument of the wrong type given to a shared type (a string where a count belongs); also a
    ``TypeError``, so callers that catch that keep working."""


class ByteSizeError(ElasticPipeError, ValueError):
    """A byte size :func:`parse_bytes` cannot read; the message names the value and the grammar."""


class ByteSizeTypeError(ByteSizeError, TypeError):
    """A byte size of the wrong type (neither an int, a float nor a string); also a ``TypeError``."""


#: Unit -> bytes, matched case-insensitively, a trailing ``B`` optional: a bare SI letter is a power of 1000 and
#: ``i`` makes it a power of 1024, as Kubernetes writes quantities ("16G" and "16GB" are 16e9 bytes, "16Gi" and
#: "16GiB" are 16 * 2**30). ``B`` (or no unit) is one byte; a lower-case ``b`` is a byte too, never a bit.
BYTE_UNITS: dict[str, int] = {
    "B": 1,
    **{f"{letter}B": 1000 ** (power + 1) for power, letter in enumerate("KMGTP")},
    **{f"{letter}iB": 1024 ** (power + 1) for power, letter in enumerate("KMGTP")},
}
#: The largest size read, 2**64 bytes (16 EiB): beyond any memory or disk a run holds, and it keeps a text such as
#: ``"1e999999"`` from building an enormous integer.
MAX_BYTES = 2**64

_UNIT_FACTORS = {unit.lower(): factor for unit, factor in BYTE_UNITS.items()} | {
    unit[:-1].lower(): factor for unit, factor in BYTE_UNITS.items() if len(unit) > 1
}
_BYTE_SIZE = re.compile(r"\s*(?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>[a-zA-Z]*)\s*")
_GRAMMAR = "a number of bytes with an optional unit B, K(B), M(B), G(B), T(B), P(B) (powers of 1000) or Ki(B), "
_GRAMMAR += "Mi(B), Gi(B), Ti(B), Pi(B) (powers of 1024), e.g. '16GiB', '16G', '512MB', '1.5e9', 4096"


def parse_bytes(size: str | int | float) -> int:
    """The number of bytes ``size`` names, in the one grammar of byte sizes every part of elastic_pipe reads.

    The grammar: an int or a whole float (bytes, returned as an int), or a string holding a number (digits, an
    optional fraction and an optional exponent: ``"4096"``, ``"1.5"``, ``".5"``, ``"1.5e9"``) followed by an
    optional unit of :data:`BYTE_UNITS`, case-insensitive, the ``B`` optional, spaces allowed around both. ``K``,
    ``M``, ``G``, ``T``, ``P`` (with or without ``B``) are powers of 1000; ``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``
    (with or without ``B``) powers of 1024. A fraction of a byte is rounded down. Signs, other units and sizes above
    :data:`MAX_BYTES` are refused. Zero is a size; a caller that needs a positive one checks that itself.

    Args:
        size: e.g. ``"16GiB"``, ``"16G"``, ``" 512 MB "``, ``"1.5e9"``, ``"0"``, ``4096``.

    Returns:
        Bytes, rounded down to a whole byte.

    Raises:
        ByteSizeError: naming ``size``: not an int, float or string, negative, not a whole number of bytes (a
            float), malformed, an unknown unit, or above :data:`MAX_BYTES`.

    Example:
        >>> parse_bytes("16GiB"), parse_bytes("16G"), parse_bytes("1.5kB"), parse_bytes(" 64 Mi ")
        (17179869184, 16000000000, 1500, 67108864)
    """
    if isinstance(size, bool) or not isinstance(size, int | float | str):
        raise ByteSizeTypeError(f"a byte size is an int, a whole float or a string like '16GiB', got {size!r}")
    if isinstance(size, int | float):
        if not math.isfinite(size) or size < 0:
            raise ByteSizeError(f"a byte size must be >= 0, got {size!r}")
        if size != int(size):
            raise ByteSizeError(f"a byte size must be a whole number of bytes, got {size!r}")
        value = Decimal(int(size))
    else:
        match = _BYTE_SIZE.fullmatch(size)
        factor = _UNIT_FACTORS.get(match["unit"].lower() or "b") if match is not None else None
        if match is None or factor is None:
            raise ByteSizeError(f"cannot read {size!r} as a size: a byte size is {_GRAMMAR}")
        number = Decimal(match["number"])
        value = number * factor if number <= MAX_BYTES else number  # no huge product: it is refused anyway
    if value > MAX_BYTES:
        raise ByteSizeError(f"a byte size must be at most 2**64 bytes, got {size!r}")
    return int(value)


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


#: How the ``K * v`` stages of a pipeline sit on its ``K`` ranks. ``"loop"``: stage ``s`` on rank ``s % K`` (torch's
#: interleaved schedules, torchtitan's "loop"); ``"v"``: the stages zig-zag, down the ranks and back up (rank ``r``
#: holds stages ``r`` and ``2K - 1 - r`` for ``v = 2``; ZBV schedules, torchtitan's "v"), so a rank's last stage of
#: one chunk and first stage of the next sit on the same rank.
PLACEMENT_STYLES = ("loop", "v")


def stage_ranks(ranks: int, virtual: int, style: str = "loop") -> tuple[int, ...]:
    """Stage -> rank for ``ranks * virtual`` stages placed in ``style`` (one of :data:`PLACEMENT_STYLES`).

    The one place the stage-to-rank rule lives: :class:`Placement` and the schedule IR's default placement read it.

    Raises:
        ElasticPipeTypeError: ``ranks`` or ``virtual`` not an int, ``style`` not a string.
        ElasticPipeError: ``ranks`` or ``virtual`` below 1, or an unknown style.

    Example:
        >>> stage_ranks(2, 2, "loop"), stage_ranks(2, 2, "v")
        ((0, 1, 0, 1), (0, 1, 1, 0))
    """
    for name, value in (("ranks", ranks), ("virtual", virtual)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ElasticPipeTypeError(f"stage_ranks: {name} must be an int, got {value!r}")
        if value < 1:
            raise ElasticPipeError(f"stage_ranks: {name} must be an int >= 1, got {value}")
    if not isinstance(style, str):
        raise ElasticPipeTypeError(f"stage_ranks: style must be a string, got {style!r}")
    if style not in PLACEMENT_STYLES:
        raise ElasticPipeError(f"stage_ranks: style must be one of {PLACEMENT_STYLES}, got {style!r}")
    if style == "loop":
        return tuple(s % ranks for s in range(ranks * virtual))
    return tuple(s % ranks if (s // ranks) % 2 == 0 else ranks - 1 - s % ranks for s in range(ranks * virtual))


@dataclass(frozen=True, slots=True)
class Placement:
    """Which stages, and so which layers, each rank of a pipeline holds: derived once from a :class:`Layout`.

    Build it with :meth:`Layout.placement`. With one stage per rank (``virtual == 1``) both styles put stage ``r``
    on rank ``r``.

    Attributes:
        style: one of :data:`PLACEMENT_STYLES`.
        pipe_len: ranks K of one pipeline replica.
        virtual: stages per rank v.
        ranks: stage -> rank, ``pipe_len * virtual`` entries (what :func:`stage_ranks` gives).
        ranges: stage -> ``(start, stop)``, the layers ``start:stop`` it holds (global layer indices).
    """

    style: str
    pipe_len: int
    virtual: int
    ranks: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        expected = stage_ranks(self.pipe_len, self.virtual, self.style)
        if tuple(self.ranks) != expected:
            raise ElasticPipeError(
                f"Placement.ranks must be {expected} for pipe_len={self.pipe_len}, virtual={self.virtual}, "
                f"style={self.style!r}; got {self.ranks!r}"
            )
        starts = [r[0] for r in self.ranges[1:]]
        if len(self.ranges) != len(expected) or any(
            not a < b or b != c for (a, b), c in zip(self.ranges, [*starts, self.ranges[-1][1]], strict=True)
        ):
            raise ElasticPipeError(
                f"Placement.ranges must be {len(expected)} adjacent, non-empty (start, stop) layer ranges, "
                f"got {self.ranges!r}"
            )

    @property
    def num_stages(self) -> int:
        """Stages of the pipeline, ``pipe_len * virtual``."""
        return len(self.ranks)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages ``rank`` holds, in the order data reaches them (increasing stage index)."""
        self._check_rank(rank)
        return tuple(s for s, r in enumerate(self.ranks) if r == rank)

    def ranges_of(self, rank: int) -> tuple[tuple[int, int], ...]:
        """The ``(start, stop)`` layer ranges of ``rank``'s stages, parallel to :meth:`stages_of`."""
        return tuple(self.ranges[s] for s in self.stages_of(rank))

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise ElasticPipeTypeError(f"Placement: rank must be an int, got {rank!r}")
        if not 0 <= rank < self.pipe_len:
            raise ElasticPipeError(f"Placement: rank must be in [0, {self.pipe_len}), got {rank}")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a job stands: how many leading layers are frozen and how the active ones are laid out.

    Attributes:
        frozen: number of frozen leading layers.
        pipe_len: pipeline length K (ranks per pipeline replica).
        replicas: number of data-parallel pipeline replicas (world size / K in the SPMD layout).
        boundaries: ``K * virtual + 1`` layer indices; stage ``s`` holds active layers
            ``boundaries[s]:boundaries[s+1]`` (indices count from the first layer of the model, so
            ``boundaries[0] == frozen``).
        microbatches: micro-batches per step and replica.
        virtual: stages per rank v (1: one stage per rank, the only layout training runs today; more: the
            stages :meth:`placement` spreads over the ranks).
    """

    frozen: int
    pipe_len: int
    replicas: int
    boundaries: tuple[int, ...]
    microbatches: int
    virtual: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.virtual, bool) or not isinstance(self.virtual, int):
            raise ElasticPipeTypeError(f"Layout.virtual must be an int, got {self.virtual!r}")
        if self.frozen < 0 or self.pipe_len < 1 or self.replicas < 1 or self.microbatches < 1 or self.virtual < 1:
            raise ElasticPipeError(
                f"Layout needs frozen >= 0, pipe_len >= 1, replicas >= 1, microbatches >= 1, virtual >= 1; got {self!r}"
            )
        if len(self.boundaries) != self.num_stages + 1:
            raise ElasticPipeError(
                f"Layout.boundaries needs pipe_len * virtual + 1 = {self.num_stages + 1} entries, "
                f"got {self.boundaries!r}"
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
    def num_stages(self) -> int:
        """Stages of one pipeline replica, ``pipe_len * virtual``."""
        return self.pipe_len * self.virtual

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Number of active layers on each stage."""
        return tuple(c - b for b, c in zip(self.boundaries, self.boundaries[1:], strict=False))

    def placement(self, style: str = "loop") -> Placement:
        """Which stages and layers each rank holds, the stages placed in ``style`` (see :data:`PLACEMENT_STYLES`).

        Raises:
            ElasticPipeError: an unknown style (ElasticPipeTypeError: not a string).

        Example:
            >>> Layout(0, 2, 1, (0, 1, 2, 3, 4), 4, virtual=2).placement("v").ranges_of(0)
            ((0, 1), (3, 4))
        """
        ranks = stage_ranks(self.pipe_len, self.virtual, style)
        ranges = tuple(zip(self.boundaries, self.boundaries[1:], strict=False))
        return Placement(style, self.pipe_len, self.virtual, ranks, ranges)


@dataclass(frozen=True, slots=True)
class TransformerShape:
    """The shape of a transformer, enough to count its parameters, FLOPs and activations.

    The facts of the built-in presets are stated once, in :mod:`elastic_pipe.models` (its preset tables), and
    turned into shapes by :func:`elastic_pipe.models.model_shape`; the partition and planner cost models take a
    shape as an argument.

    Attributes:
        name: a human-readable name, e.g. ``"vit-b16"``.
        family: one of :data:`TRANSFORMER_FAMILIES`.
        blocks: transformer blocks (the freezable units).
        hidden: hidden size d.
        heads: attention heads; must divide ``hidden``.
        ffn: MLP inner size f.
        seq_len: tokens per sample (for a ViT: patches plus the class token, ``(image / patch)^2 + 1``).
        vocab: token vocabulary (text models; 0 for a ViT).
        positions: rows of the learned position table (at least ``seq_len``).
        type_vocab: rows of the segment (token-type) table (BERT: 2; 0 for none).
        image: image side in pixels (ViT; 0 for text models).
        patch: patch side in pixels (ViT; 0 for text models).
        channels: image channels (ViT; 0 for text models).
        classes: classifier outputs (ViT; 0 for text models, whose heads predict tokens).
    """

    name: str
    family: str
    blocks: int
    hidden: int
    heads: int
    ffn: int
    seq_len: int
    vocab: int = 0
    positions: int = 0
    type_vocab: int = 0
    image: int = 0
    patch: int = 0
    channels: int = 0
    classes: int = 0

    def __post_init__(self) -> None:
        owner = f"TransformerShape({self.name!r})"
        if not isinstance(self.name, str):
            raise ElasticPipeTypeError(f"{owner}.name must be a string, got {type(self.name).__name__}")
        if not isinstance(self.family, str):
            raise ElasticPipeTypeError(f"{owner}.family must be a string, got {self.family!r}")
        for key in ("blocks", "hidden", "heads", "ffn", "seq_len", *_SHAPE_OPTIONAL):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ElasticPipeTypeError(f"{owner}.{key} must be an int, got {value!r}")
        if self.family not in TRANSFORMER_FAMILIES:
            raise ElasticPipeError(f"{owner}.family must be one of {TRANSFORMER_FAMILIES}, got {self.family!r}")
        for key in ("blocks", "hidden", "heads", "ffn", "seq_len"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIMENSION:
                raise ElasticPipeError(f"{owner}.{key} must be an int in [1, {MAX_DIMENSION}], got {value!r}")
        for key in _SHAPE_OPTIONAL:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DIMENSION:
                raise ElasticPipeError(f"{owner}.{key} must be an int in [0, {MAX_DIMENSION}], got {value!r}")
        if self.hidden % self.heads:
            raise ElasticPipeError(f"{owner}: hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.positions < self.seq_len:
            raise ElasticPipeError(
                f"{owner}: seq_len={self.seq_len} needs a position table of at least that many rows, "
                f"got positions={self.positions}"
            )
        if self.family == "vit":
            if min(self.image, self.patch, self.channels, self.classes) < 1 or self.image % self.patch:
                raise ElasticPipeError(
                    f"{owner}: a ViT needs image, patch, channels, classes >= 1 and patch dividing image, got "
                    f"image={self.image} patch={self.patch} channels={self.channels} classes={self.classes}"
                )
            if self.seq_len != (self.image // self.patch) ** 2 + 1:
                raise ElasticPipeError(
                    f"{owner}: a ViT's seq_len must be (image/patch)^2 + 1 = {(self.image // self.patch) ** 2 + 1}, "
                    f"got {self.seq_len}"
                )
        elif self.vocab < 1:
            raise ElasticPipeError(f"{owner}: a {self.family} model needs vocab >= 1, got {self.vocab}")

    @property
    def causal(self) -> bool:
        """Whether attention is causal (a fused kernel then skips half of the score matrix)."""
        return self.family == "gpt"

    def with_seq_len(self, seq_len: int) -> TransformerShape:
        """The same text model at another sequence length (at most ``positions``).

        Raises:
            ElasticPipeError: for a ViT (its length follows from image and patch) or a length the position table
                does not cover.
        """
        if self.family == "vit":
            raise ElasticPipeError("a ViT's sequence length follows from image and patch; change those instead")
        return replace(self, seq_len=seq_len)
