"""Stage residency: a rank holds the weights of only the sub-layers it runs.

A :class:`SubLayerModel` is built on the meta device (shapes, no storage), then :func:`materialize` gives chosen
sub-layers real (uninitialized) storage on a device and :func:`load_sublayers` fills them from a checkpoint,
reading only their tensors; the other sub-layers stay on the meta device and take no memory. :func:`release` sends
sub-layers back to the meta device when a re-partition moves them to another rank.

Which checkpoint tensor fills which of the model's tensors is a *weight map*, ``{model key: checkpoint key}``
(e.g. :func:`elastic_pipe.models.llama.llama_weight_map`); a checkpoint is anything with ``keys()`` and
``get_tensor(name)`` (:class:`TensorReader`), which is exactly what ``safetensors.safe_open`` returns, so a
safetensors file is read tensor by tensor without loading the rest. :func:`open_safetensors` also opens sharded
checkpoint directories (``model.safetensors.index.json``).

Parameters are replaced, not resized in place: a new ``nn.Parameter`` takes the old one's place in every module
that holds it, so a parameter shared by two sub-layers (a tied embedding) stays shared, and stays resident while
any resident sub-layer uses it. An optimizer built before :func:`materialize` or :func:`release` still holds the
old tensors: build it afterwards. Modules whose non-persistent buffers are computed at construction cannot be
materialized this way (they would hold uninitialized memory); the models in this package have none.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeAlias, TypeVar

import torch
from torch import nn

from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.sublayer import SubLayerModel

__all__ = [
    "MappingReader",
    "TensorReader",
    "WeightMap",
    "hold_only",
    "load_sublayers",
    "materialize",
    "materialize_from_safetensors",
    "meta_build",
    "open_safetensors",
    "release",
    "resident_sublayers",
    "safetensors_meta",
    "shared_parameters",
]

M = TypeVar("M", bound=nn.Module)

#: ``{model state-dict key: checkpoint key}``: where each of the model's tensors is read from.
WeightMap: TypeAlias = Mapping[str, str]

#: The index file of a sharded safetensors checkpoint directory (its ``weight_map`` names each key's shard).
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: The single weights file of an unsharded checkpoint directory.
SAFETENSORS_FILE = "model.safetensors"


class TensorReader(Protocol):
    """A checkpoint read one tensor at a time (``safetensors.safe_open`` handles are one)."""

    def keys(self) -> Iterable[str]: ...

    def get_tensor(self, name: str) -> torch.Tensor: ...


class MappingReader:
    """An in-memory state dict as a :class:`TensorReader`."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        CHECK.mapping("tensors", tensors)
        self.tensors = tensors

    def keys(self) -> Iterable[str]:
        return self.tensors.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def meta_build(factory: Callable[[], M]) -> M:
    """``factory()`` on the meta device: every parameter has its shape and dtype but no storage."""
    CHECK.callable("factory", factory)
    with torch.device("meta"):
        return factory()


def check_placement(device: object, dtype: object) -> None:
    """Raise ModelTypeError unless ``device`` is a device or its name and ``dtype`` a dtype or None."""
    CHECK.instance("device", device, str | torch.device)
    if dtype is not None:
        CHECK.instance("dtype", dtype, torch.dtype)


def _indices(model: SubLayerModel, indices: Iterable[int]) -> list[int]:
    chosen = sorted(set(CHECK.ints("indices", indices, empty=True)))
    bad = [i for i in chosen if not 0 <= i < model.num_sublayers]
    if bad:
        raise ModelError(f"sub-layer indices must be in [0, {model.num_sublayers}), got {bad}")
    return chosen


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _replace(model: nn.Module, targets: set[int], make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Put ``make(t)`` in the place of every tensor ``t`` whose id is in ``targets``, in every module holding it."""
    made: dict[int, torch.Tensor] = {}  # one replacement per old tensor keeps shared parameters shared
    for module in model.modules():
        slots: list[tuple[str, torch.Tensor, bool]] = [
            (name, t, True) for name, t in module.named_parameters(recurse=False, remove_duplicate=False)
        ]
        slots += [(name, t, False) for name, t in module.named_buffers(recurse=False, remove_duplicate=False)]
        for name, tensor, is_param in slots:
            if id(tensor) not in targets:
                continue
            if id(tensor) not in made:
                new = make(tensor)
                made[id(tensor)] = nn.Parameter(new, requires_grad=tensor.requires_grad) if is_param else new
            setattr(module, name, made[id(tensor)])


def materialize(
    model: SubLayerModel,
    indices: Iterable[int],
    device: torch.device | str = "cpu",
    *,
    dtype: torch.dtype | None = None,
) -> tuple[str, ...]:
    """Give the meta tensors of sub-layers ``indices`` real, uninitialized storage on ``device``.

    Fill them with :func:`load_sublayers` (or initialize them yourself). Tensors already materialized are left
    alone; the other sub-layers stay on the meta device.

    Args:
        model: the model, typically from :func:`meta_build`.
        indices: sub-layer offsets to materialize.
        device: where their storage goes.
        dtype: floating-point dtype of the new storage; default: the meta tensors' own.

    Returns:
        The state-dict keys of the tensors that got storage (all names of a shared one), in state-dict order.

    Raises:
        ModelError: for an index outside ``[0, num_sublayers)``.
    """
    CHECK.instance("model", model, SubLayerModel)
    check_placement(device, dtype)
    targets = {id(t) for i in _indices(model, indices) for t in _tensors(model[i]) if t.is_meta}
    keys = tuple(k for k, t in model.state_dict(keep_vars=True).items() if id(t) in targets)

    def make(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)

    _replace(model, targets, make)
    return keys


def release(model: SubLayerModel, indices: Iterable[int]) -> None:
    """Send sub-layers ``indices`` back to the meta device, dropping their storage and gradients.

    A tensor that a resident sub-layer outside ``indices`` (see :func:`resident_sublayers`) also uses is kept:
    releasing the head keeps a tied embedding matrix that the embedding still needs. On the head's rank the
    embedding may look resident through that one shared matrix, so release everything the rank no longer runs
    in one call (as :func:`hold_only` does) to free it there.

    Raises:
        ModelError: for an index outside ``[0, num_sublayers)``.
    """
    CHECK.instance("model", model, SubLayerModel)
    chosen = set(_indices(model, indices))
    kept = {id(t) for i in resident_sublayers(model) if i not in chosen for t in _tensors(model[i])}
    targets = {id(t) for i in chosen for t in _tensors(model[i]) if not t.is_meta and id(t) not in kept}
    _replace(model, targets, lambda t: torch.empty_like(t, device="meta"))


def resident_sublayers(model: SubLayerModel) -> tuple[int, ...]:
    """Offsets of the sub-layers none of whose tensors is on the meta device."""
    CHECK.instance("model", model, SubLayerModel)
    return tuple(i for i in range(model.num_sublayers) if not any(t.is_meta for t in _tensors(model[i])))


def shared_parameters(model: SubLayerModel) -> tuple[tuple[str, ...], ...]:
    """Groups of state-dict keys, in different sub-layers, that name one parameter (e.g. a tied embedding).

    A pipeline that puts a group's sub-layers on different ranks holds the parameter on each of them and must
    sum their gradients (all-reduce among those ranks) before each optimizer step, so the copies stay equal.
    Call it on the whole model before :func:`materialize` or :func:`release` split a group's copies apart.
    """
    CHECK.instance("model", model, SubLayerModel)
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return tuple(tuple(group) for group in names.values() if len({n.split(".", 1)[0] for n in group}) > 1)


def _child_names(model: SubLayerModel) -> list[str]:
    return [name for name, _ in model.named_children()]


def load_sublayers(
    model: SubLayerModel,
    indices: Iterable[int],
    reader: TensorReader,
    weight_map: WeightMap,
    *,
    only: Collection[str] | None = None,
) -> tuple[str, ...]:
    """Copy the tensors of sub-layers ``indices`` from ``reader``, reading only those (each at most once).

    Args:
        model: a model whose sub-layers ``indices`` are materialized.
        indices: sub-layer offsets to load.
        reader: the checkpoint (a ``safetensors.safe_open`` handle, :class:`MappingReader`, ...).
        weight_map: ``{model key: checkpoint key}`` for (at least) every tensor of those sub-layers.
        only: load just these model keys (e.g. what :func:`materialize` returned, so that tensors already
            resident, and perhaps trained, are not overwritten); default: every tensor of the sub-layers.

    Returns:
        The checkpoint keys read, in reading order.

    Raises:
        ModelError: if a tensor is still on the meta device, has no entry in ``weight_map``, is missing from the
            checkpoint or has another shape there.
    """
    CHECK.instance("model", model, SubLayerModel)
    CHECK.callable("reader.get_tensor", getattr(reader, "get_tensor", None))
    CHECK.mapping("weight_map", weight_map)
    if only is not None:
        CHECK.items("only", only, empty=True)
    available = set(reader.keys())
    children = _child_names(model)
    filled: set[int] = set()
    read: list[str] = []
    for i in _indices(model, indices):
        for key, tensor in model[i].state_dict(prefix=f"{children[i]}.", keep_vars=True).items():
            if id(tensor) in filled or (only is not None and key not in only):
                continue  # a tied parameter shows up under two keys
            if tensor.is_meta:
                raise ModelError(f"{key!r} of sub-layer {i} is on the meta device; materialize({i}) first")
            if key not in weight_map:
                raise ModelError(f"weight map has no entry for {key!r} (sub-layer {i})")
            source = weight_map[key]
            if source not in available:
                raise ModelError(f"checkpoint has no tensor {source!r} (for {key!r})")
            value = reader.get_tensor(source)
            read.append(source)
            if tuple(value.shape) != tuple(tensor.shape):
                raise ModelError(
                    f"checkpoint tensor {source!r} has shape {tuple(value.shape)}, {key!r} needs {tuple(tensor.shape)}"
                )
            with torch.no_grad():
                tensor.copy_(value)
            filled.add(id(tensor))
    return tuple(read)


class _Shards:
    """The keys of a safetensors file or sharded directory, and each key's file; files open on first use."""

    def __init__(self, where: Mapping[str, Path], open_file: Callable[[Path], TensorReader]) -> None:
        self.where = where
        self.open_file = open_file
        self.handles: dict[Path, TensorReader] = {}

    def keys(self) -> Iterable[str]:
        return self.where.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        file = self.where[name]
        if file not in self.handles:
            self.handles[file] = self.open_file(file)
        return self.handles[file].get_tensor(name)


def open_safetensors(path: str | Path) -> contextlib.AbstractContextManager[TensorReader]:
    """Open a safetensors checkpoint for reading tensor by tensor (nothing is loaded until asked for).

    Args:
        path: a ``.safetensors`` file, or a directory holding :data:`SAFETENSORS_INDEX` (sharded) or
            :data:`SAFETENSORS_FILE`.

    Raises:
        ModelError: if no checkpoint is there.
    """
    CHECK.instance("path", path, str | Path)
    return _open_safetensors(path)


@contextlib.contextmanager
def _open_safetensors(path: str | Path) -> Iterator[TensorReader]:
    from safetensors import safe_open  # noqa: PLC0415 - optional dependency, only this loader needs it

    with contextlib.ExitStack() as stack:

        def open_file(file: Path) -> TensorReader:
            handle: TensorReader = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            return handle

        p = Path(path)
        if p.is_dir() and (p / SAFETENSORS_INDEX).is_file():
            index = json.loads((p / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
            where = {key: p / shard for key, shard in index["weight_map"].items()}
        else:
            file = p / SAFETENSORS_FILE if p.is_dir() else p
            if not file.is_file():
                raise ModelError(
                    f"no safetensors checkpoint at {str(path)!r} (expected a file or a directory with "
                    f"{SAFETENSORS_INDEX} or {SAFETENSORS_FILE})"
                )
            handle = open_file(file)
            shards = _Shards(dict.fromkeys(handle.keys(), file), open_file)
            shards.handles[file] = handle
            yield shards
            return
        yield _Shards(where, open_file)


#: safetensors dtype names (the header's ``dtype`` field) and the torch dtypes they hold.
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
#: Bytes of the little-endian header length at the start of a safetensors file.
_HEADER_LENGTH_BYTES = 8


def _header(file: Path) -> dict[str, torch.Tensor]:
    with file.open("rb") as fh:
        length = int.from_bytes(fh.read(_HEADER_LENGTH_BYTES), "little")
        header = json.loads(fh.read(length))
    out: dict[str, torch.Tensor] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise ModelError(f"{str(file)!r}: tensor {key!r} has unsupported dtype {entry['dtype']!r}")
        out[key] = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]], device="meta")
    return out


def safetensors_meta(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint as a meta tensor (its shape and dtype), read from the headers only.

    Args:
        path: as :func:`open_safetensors` takes it.

    Raises:
        ModelError: if no checkpoint is there.
    """
    CHECK.instance("path", path, str | Path)
    p = Path(path)
    if p.is_dir() and (p / SAFETENSORS_INDEX).is_file():
        index = json.loads((p / SAFETENSORS_INDEX).read_text(encoding="utf-8"))
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            out.update(_header(p / shard))
        return out
    file = p / SAFETENSORS_FILE if p.is_dir() else p
    if not file.is_file():
        raise ModelError(f"no safetensors checkpoint at {str(path)!r}")
    return _header(file)


def materialize_from_safetensors(
    model: SubLayerModel,
    indices: Sequence[int],
    path: str | Path,
    weight_map: WeightMap,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[str, ...]:
    """:func:`materialize` sub-layers ``indices`` on ``device`` and :func:`load_sublayers` them from ``path``.

    Only the tensors that were on the meta device are read: a tensor already resident (a tied embedding that the
    head brought in, or a sub-layer that stayed on this rank) keeps its current values.

    Returns:
        The checkpoint keys read (only those of the chosen sub-layers' new tensors).

    Raises:
        ModelError: as :func:`materialize`, :func:`load_sublayers` and :func:`open_safetensors` do.
    """
    CHECK.instance("model", model, SubLayerModel)
    check_placement(device, dtype)
    CHECK.instance("path", path, str | Path)
    CHECK.mapping("weight_map", weight_map)
    fresh = materialize(model, indices, device, dtype=dtype)
    with open_safetensors(path) as reader:
        return load_sublayers(model, indices, reader, weight_map, only=set(fresh))


def hold_only(
    model: SubLayerModel,
    indices: Iterable[int],
    path: str | Path,
    weight_map: WeightMap,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[str, ...]:
    """Make sub-layers ``indices`` exactly what ``model`` holds: load the missing ones, release all others.

    What a rank calls for its stage, at start-up (on a :func:`meta_build` model) and after every re-partition:
    sub-layers it kept keep their current (trained) values, new ones are read from the checkpoint at ``path``,
    and the storage of the ones it gave away is freed.

    Returns:
        The checkpoint keys read.

    Raises:
        ModelError: as :func:`materialize_from_safetensors` does.
    """
    CHECK.instance("model", model, SubLayerModel)
    check_placement(device, dtype)
    CHECK.instance("path", path, str | Path)
    CHECK.mapping("weight_map", weight_map)
    chosen = _indices(model, indices)
    read = materialize_from_safetensors(model, chosen, path, weight_map, device=device, dtype=dtype)
    release(model, set(range(model.num_sublayers)) - set(chosen))
    return read
