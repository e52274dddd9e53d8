"""Where a sub-layer's weights come from when it is materialized: the one way a meta-built model gets real values.

A :class:`SubLayerModel` built on the meta device has shapes and no values. Each rank materializes only the
sub-layers it holds (:func:`materialize_sublayers`), so the values of one sub-layer must be computable without the
others. The model carries that recipe as :attr:`SubLayerModel.sublayer_init`, a :data:`SubLayerInit`:

* :class:`SeededInit` - the built-in builders' initialization, drawn per sub-layer from its own generator seeded
  by ``(seed, sub-layer index)`` (:func:`sublayer_seed`). Any process gets the same values for sub-layer ``j``
  whatever else it holds, so a model built whole on one process and the sub-layers materialized across ranks are
  equal tensor for tensor. Values are drawn in float32 on the CPU and then cast, so a float64 model holds exactly
  the float32 model's values and a GPU rank the CPU's.
* :class:`CheckpointInit` - pretrained weights: the sub-layer's tensors read from a checkpoint through a weight
  map (a safetensors file is read tensor by tensor, :func:`~elastic_pipe.models.residency.open_safetensors`), and a
  fallback init for the tensors the checkpoint lacks (a new classifier).
* anything else with the :data:`SubLayerInit` signature, for a user's own model.

A model whose tensors are all real needs no recipe; a meta tensor without one is a :class:`MaterializeError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from elastic_pipe.models._checks import check_seed
from elastic_pipe.models.errors import CHECK, ModelError, ModelTypeError
from elastic_pipe.models.residency import TensorReader, WeightMap, load_sublayers, materialize
from elastic_pipe.models.sublayer import SubLayerInit, SubLayerModel

__all__ = [
    "INIT_STD",
    "CheckpointInit",
    "MaterializeError",
    "MissingInit",
    "SeededInit",
    "SubLayerInit",
    "build_seeded",
    "check_materializable",
    "identity_map",
    "materialize_sublayers",
    "meta_tensors",
    "sublayer_keys_of",
    "sublayer_seed",
]

#: Standard deviation of the normal initialization of weights and embeddings (BERT, GPT-2 and ViT all use 0.02).
INIT_STD = 0.02
#: Truncate the initial normal at this many standard deviations, as the reference ViT/BERT code does.
_TRUNCATE_STDS = 2.0

M = TypeVar("M", bound=SubLayerModel)


class MaterializeError(ModelError):
    """A sub-layer on the meta device has no way to get its values (the model has no ``sublayer_init``)."""


def sublayer_seed(seed: int, index: int) -> int:
    """The seed of sub-layer ``index``'s generator: 64 bits of SHA-256 of ``"seed:index"`` (no collisions between
    nearby seeds and indices, and the same in every process, unlike Python's ``hash``)."""
    check_seed("seed", seed)
    CHECK.int("index", index)
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _child_names(model: SubLayerModel) -> list[str]:
    return [name for name, _ in model.named_children()]


def sublayer_keys_of(model: SubLayerModel, index: int) -> list[str]:
    """The state-dict keys of sub-layer ``index`` (whole-model keys, in state-dict order)."""
    prefix = _child_names(model)[index] + "."
    return [k for k in model.state_dict(keep_vars=True) if k.startswith(prefix)]


def _first_holder(model: SubLayerModel) -> dict[int, tuple[int, str]]:
    """For each parameter (by id), the first sub-layer that holds it and its key there."""
    index = {name: j for j, name in enumerate(_child_names(model))}
    first: dict[int, tuple[int, str]] = {}
    for key, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), (index[key.split(".", 1)[0]], key))
    return first


def _initial_value(
    name: str, p: torch.Tensor, *, dtype: torch.dtype, norm: bool, generator: torch.Generator
) -> torch.Tensor:
    """The built-in initial value of parameter ``name``: a norm's weight 1 and bias 0, other biases (and
    non-floating tensors) 0, everything else a truncated normal (std :data:`INIT_STD`) drawn from ``generator``."""
    value = torch.empty(p.shape, dtype=dtype)
    if norm:
        value.fill_(1.0 if name.endswith("weight") else 0.0)
    elif name.endswith("bias") or not p.is_floating_point():
        value.zero_()
    else:
        limit = _TRUNCATE_STDS * INIT_STD
        nn.init.trunc_normal_(value, std=INIT_STD, a=-limit, b=limit, generator=generator)
    return value


@dataclass(frozen=True, slots=True)
class SeededInit:
    """The built-in builders' initialization, one generator per sub-layer.

    Norm weights 1 and biases 0, other biases 0, everything else a truncated normal (std :data:`INIT_STD`, cut at
    two standard deviations), in the order of the sub-layer's ``named_parameters``. A parameter tied across
    sub-layers takes the value its first sub-layer draws.

    Attributes:
        seed: the model's seed.
        norms: module types whose ``weight`` starts at 1 and ``bias`` at 0.
        same_as: ``{key: source key}``: ``key`` starts as a copy of ``source key``'s initial value (in another
            sub-layer), e.g. GPT-2's untied head starting equal to the token embedding.
    """

    seed: int
    norms: tuple[type[nn.Module], ...] = (nn.LayerNorm,)
    same_as: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_seed("seed", self.seed)
        for i, kind in enumerate(CHECK.items("norms", self.norms, empty=True)):
            if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
                raise ModelTypeError(f"norms[{i}] must be a torch module class, got {kind!r}")
        CHECK.mapping("same_as", self.same_as)

    def values(self, model: SubLayerModel, index: int) -> dict[str, torch.Tensor]:
        """Sub-layer ``index``'s initial parameters (float32 on the CPU, by whole-model key), tensors of other
        sub-layers it shares left out."""
        sub = model[index]
        prefix = _child_names(model)[index] + "."
        generator = torch.Generator().manual_seed(sublayer_seed(self.seed, index))
        norm_params = {id(p) for m in sub.modules() if isinstance(m, self.norms) for p in m.parameters()}
        return {
            prefix + name: _initial_value(
                name,
                p,
                dtype=torch.float32 if p.is_floating_point() else p.dtype,
                norm=id(p) in norm_params,
                generator=generator,
            )
            for name, p in sub.named_parameters()
        }

    def __call__(self, model: SubLayerModel, index: int, keys: Collection[str]) -> None:
        if not keys:
            return
        index_of = {name: j for j, name in enumerate(_child_names(model))}
        first = _first_holder(model)
        state = model.state_dict(keep_vars=True)
        drawn: dict[int, dict[str, torch.Tensor]] = {}

        def value_of(key: str) -> torch.Tensor:
            if key in self.same_as:
                key = self.same_as[key]
            tensor = state[key]
            j, key = first.get(id(tensor), (index_of[key.split(".", 1)[0]], key))
            if j not in drawn:
                drawn[j] = self.values(model, j)
            return drawn[j][key]

        with torch.no_grad():
            for key in keys:
                state[key].copy_(value_of(key))


class MissingInit:
    """The tensors a checkpoint lacks (a new classifier), all drawn from one generator seeded by ``seed``, in the
    model's parameter order and each in its own dtype - the values a pretrained model's new head has always had.

    Every draw is made whatever the sub-layer asked for, so the values do not depend on what a process holds; the
    missing tensors are few (a head), so that costs nothing.

    Attributes:
        seed: the generator's seed.
        missing: the keys the checkpoint lacks (parameters drawn; other tensors zeroed).
    """

    def __init__(self, seed: int, missing: Collection[str]) -> None:
        self.seed = check_seed("seed", seed)
        self.missing = frozenset(
            CHECK.str(f"missing[{i}]", k) for i, k in enumerate(CHECK.items("missing", missing, empty=True))
        )
        self._values: dict[str, torch.Tensor] | None = None

    def _draw(self, model: SubLayerModel) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed)
        norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
        return {
            name: _initial_value(name, p, dtype=p.dtype, norm=id(p) in norms, generator=generator)
            for name, p in model.named_parameters()
            if name in self.missing
        }

    def __call__(self, model: SubLayerModel, index: int, keys: Collection[str]) -> None:
        if self._values is None:
            self._values = self._draw(model)
        state = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for key in keys:
                if key in self._values:
                    state[key].copy_(self._values[key])
                else:
                    state[key].zero_()


def _counted(reader: TensorReader, read: list[str]) -> TensorReader:
    class _Counting:
        def keys(self) -> Iterable[str]:
            return reader.keys()

        def get_tensor(self, name: str) -> torch.Tensor:
            read.append(name)
            return reader.get_tensor(name)

    return _Counting()


class CheckpointInit:
    """Pretrained values: each sub-layer's tensors read from a checkpoint, only theirs, when it is materialized.

    Args:
        open_reader: opens the checkpoint, e.g. ``lambda: open_safetensors(path)``; it is opened once per
            sub-layer materialized (a safetensors file maps lazily, so that costs only the header).
        weight_map: ``{model key: checkpoint key}`` for the tensors the checkpoint holds.
        fallback: initializes the tensors ``weight_map`` does not name (a new head); ``None``: each must be named.

    Attributes:
        read: the checkpoint keys read so far, in order (what this process took from the file).
    """

    def __init__(
        self,
        open_reader: Callable[[], AbstractContextManager[TensorReader]],
        weight_map: WeightMap,
        fallback: SubLayerInit | None = None,
    ) -> None:
        self.open_reader = CHECK.callable("open_reader", open_reader)
        self.weight_map = CHECK.mapping("weight_map", weight_map)
        if fallback is not None:
            CHECK.callable("fallback", fallback)
        self.fallback = fallback
        self.read: list[str] = []

    def __call__(self, model: SubLayerModel, index: int, keys: Collection[str]) -> None:
        loaded = [k for k in keys if k in self.weight_map]
        rest = [k for k in keys if k not in self.weight_map]
        if rest and self.fallback is None:
            raise MaterializeError(f"the checkpoint's weight map has no entry for {rest[0]!r} and there is no fallback")
        if loaded:
            with self.open_reader() as reader:
                load_sublayers(model, [index], _counted(reader, self.read), self.weight_map, only=set(loaded))
        if rest:
            assert self.fallback is not None
            self.fallback(model, index, rest)


def identity_map(tensors: Iterable[str]) -> dict[str, str]:
    """The weight map of a checkpoint that uses the model's own keys."""
    return {k: k for k in tensors}


def meta_tensors(model: nn.Module) -> list[str]:
    """State-dict keys of ``model``'s tensors on the meta device."""
    return [k for k, t in model.state_dict(keep_vars=True).items() if t.is_meta]


def check_materializable(model: nn.Module) -> None:
    """Raise :class:`MaterializeError` if ``model`` has meta tensors and no ``sublayer_init`` to fill them.

    Raises:
        MaterializeError: naming the first meta tensor and the ways to give it values.
    """
    CHECK.instance("model", model, nn.Module)
    meta = meta_tensors(model)
    if meta and getattr(model, "sublayer_init", None) is None:
        raise MaterializeError(
            f"{len(meta)} tensors of the model are on the meta device (first: {meta[0]!r}) and it has no "
            "sublayer_init to give them values: set model.sublayer_init (a SeededInit, a CheckpointInit or your own "
            "(model, index, keys) function) or pass the model with real weights"
        )


def materialize_sublayers(
    model: SubLayerModel, indices: Iterable[int], device: torch.device | str = "cpu"
) -> tuple[str, ...]:
    """Give sub-layers ``indices`` real storage on ``device`` and their values from ``model.sublayer_init``.

    Tensors that already have storage keep it and their values (a sub-layer this rank kept, perhaps trained).

    Returns:
        The state-dict keys that were materialized.

    Raises:
        MaterializeError: some of them were on the meta device and the model has no ``sublayer_init``.
        ModelError: for an index outside ``[0, num_sublayers)``.
    """
    CHECK.instance("model", model, SubLayerModel)
    CHECK.instance("device", device, str | torch.device)
    chosen = sorted(set(CHECK.ints("indices", indices, empty=True)))
    init: SubLayerInit | None = getattr(model, "sublayer_init", None)
    if init is None and any(t.is_meta for i in chosen for t in (*model[i].parameters(), *model[i].buffers())):
        check_materializable(model)
    fresh = materialize(model, chosen, device)
    if not fresh:
        return fresh
    assert init is not None
    new = set(fresh)
    done: set[str] = set()
    for i in chosen:
        mine = [k for k in sublayer_keys_of(model, i) if k in new and k not in done]
        init(model, i, mine)
        done.update(mine)
    return fresh


def build_seeded(
    factory: Callable[[], M],
    seed: int,
    dtype: torch.dtype,
    *,
    meta: bool = False,
    init: Callable[[int], SubLayerInit] | None = None,
) -> M:
    """Build a model on the meta device with a :class:`SeededInit` (or ``init(seed)``); materialize it all on the
    CPU unless ``meta``.

    Both ways give the same values: the whole model is exactly its sub-layers materialized one by one. Under a
    ``torch.device("meta")`` context the model stays on the meta device too.
    """
    check_seed("seed", seed)
    CHECK.instance("dtype", dtype, torch.dtype)
    meta = meta or torch.empty(0).is_meta
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = factory().to(dtype)
    model.sublayer_init = SeededInit(seed) if init is None else init(seed)
    if not meta:
        materialize_sublayers(model, range(model.num_sublayers), "cpu")
    return model
