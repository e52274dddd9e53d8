"""The items of a map-style dataset: what each must look like, how it is read, checked and stacked, and every label
read at once from the dataset's own table.

A :class:`~elastic_pipe.orchestrator.data.dataset_split.DatasetSplit` reads its items through a ``DataLoader``
whose workers fetch ``(dataset index, raw item)`` (:class:`Items`) and check and stack a batch of them
(:class:`Collate`); the up-front check (``[data] check``) reads them through :class:`Scan`, which returns the first
failure instead of raising. Every item must fit item 0 (:class:`ItemSpec`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch
import torch.utils.data

from elastic_pipe.orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.data.step_data import MapDataset

__all__: list[str] = []  # internal: the package face exports what others use

#: A batch as :class:`Collate` stacks it: the inputs and the labels (each ``None`` when not asked for).
Pair: TypeAlias = tuple[torch.Tensor | None, torch.Tensor | None]


@dataclass(frozen=True)
class ItemSpec:
    """What every item of a dataset must look like (item 0's shapes and dtypes).

    Attributes:
        input_shape, input_dtype: the input's.
        label_shape, label_dtype: the label's.
        num_classes: labels must lie in ``[0, num_classes)`` (integer labels; ``None``: not checked).
        on_host: whether item 0's input is in host memory (a dataset holding its items on a GPU is read without
            pinned memory, which only host tensors have).
    """

    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    label_shape: tuple[int, ...]
    label_dtype: torch.dtype
    num_classes: int | None = None
    on_host: bool = True

    def check(self, index: int, x: torch.Tensor, y: torch.Tensor) -> str | None:
        """Why item ``index`` (``(x, y)``) does not fit, or ``None``."""
        if tuple(x.shape) != self.input_shape or x.dtype != self.input_dtype:
            return (
                f"dataset item {index}: input {tuple(x.shape)} {x.dtype} differs from item 0's "
                f"{self.input_shape} {self.input_dtype}"
            )
        if tuple(y.shape) != self.label_shape or y.dtype != self.label_dtype:
            return (
                f"dataset item {index}: label {tuple(y.shape)} {y.dtype} differs from item 0's "
                f"{self.label_shape} {self.label_dtype}"
            )
        if self.num_classes is not None and not y.is_floating_point() and y.numel():
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= self.num_classes:
                bad = lo if lo < 0 else hi
                return f"dataset item {index}: label {bad} is out of range [0, {self.num_classes})"
        return None

    def with_classes(self, num_classes: int | None) -> ItemSpec:
        """This spec, checking labels against ``num_classes``."""
        return dataclasses.replace(self, num_classes=num_classes)


@dataclass(frozen=True)
class _Unreadable:
    """What reading an item raised (an ``OSError``: a missing or unreadable file), carried to the collate step,
    which names the item (and the path the error names)."""

    reason: str


def read_item(dataset: MapDataset, index: int) -> object:
    """Item ``index`` of ``dataset``, or what reading it raised (an ``OSError``), for the collate step to name."""
    try:
        return dataset[index]
    except OSError as exc:
        return _Unreadable(f"{type(exc).__name__}: {exc}")


def _as_pair(index: int, item: object) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(item, _Unreadable):
        raise ConfigError(f"dataset item {index} cannot be read: {item.reason}")
    if not (isinstance(item, tuple | list) and len(item) == 2):
        raise ConfigError(f"dataset item {index} is {type(item).__name__}, expected an (input, label) pair")
    try:
        x, y = (torch.as_tensor(v) for v in item)
    except (TypeError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"dataset item {index}: {exc} (the dataset's transform must return tensors or arrays)"
        ) from None
    return x, y


def item_spec(dataset: MapDataset, num_classes: int | None = None) -> ItemSpec:
    """The :class:`ItemSpec` of ``dataset``'s item 0."""
    x, y = _as_pair(0, read_item(dataset, 0))
    return ItemSpec(tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, num_classes, x.device.type == "cpu")


#: The dataset attributes :func:`label_table` reads labels from, in this order (torchvision's, then ours).
LABEL_ATTRIBUTES = ("targets", "labels")


def label_table(dataset: MapDataset, spec: ItemSpec) -> torch.Tensor | None:
    """Every item's label without reading an item: the dataset's ``targets`` or ``labels`` attribute, when it is a
    sequence, array or tensor with one label per item shaped like item 0's (cast to its dtype); ``None`` when there
    is none, or when the dataset has a ``target_transform`` (torchvision's: then ``targets`` are not what
    ``__getitem__`` returns).

    Raises:
        ConfigError: a label out of ``[0, spec.num_classes)`` (naming the item).
    """
    table, failure = label_table_and_failure(dataset, spec)
    if failure is not None:
        raise ConfigError(failure[1])
    return table


def label_table_and_failure(dataset: MapDataset, spec: ItemSpec) -> tuple[torch.Tensor | None, tuple[int, str] | None]:
    """:func:`label_table`, and the first item whose label is out of range ``(index, reason)`` instead of raising."""
    if getattr(dataset, "target_transform", None) is not None:
        return None, None
    n = len(dataset)
    for name in LABEL_ATTRIBUTES:
        values = getattr(dataset, name, None)
        if values is None or callable(values):
            continue
        try:
            table = torch.as_tensor(values)
        except (TypeError, ValueError, RuntimeError):
            continue
        if table.dim() == 0 or table.shape[0] != n or tuple(table.shape[1:]) != spec.label_shape:
            continue
        if table.is_floating_point() != spec.label_dtype.is_floating_point:
            continue
        table = table.to("cpu", spec.label_dtype)
        if spec.num_classes is not None and not table.is_floating_point() and table.numel():
            rows = table.reshape(n, -1)
            bad = ((rows < 0) | (rows >= spec.num_classes)).any(dim=1).nonzero().flatten()
            if bad.numel():
                index = int(bad[0])
                row = rows[index]
                value = int(row[(row < 0) | (row >= spec.num_classes)][0])
                reason = (
                    f"dataset item {index}: label {value} (the dataset's {name}) is out of range "
                    f"[0, {spec.num_classes})"
                )
                return None, (index, reason)
        return table, None
    return None, None


class Items(torch.utils.data.Dataset[tuple[int, object]]):
    """Position ``p`` of a split -> ``(dataset index, raw item)``: what the loader's workers fetch."""

    def __init__(self, dataset: MapDataset, indices: torch.Tensor) -> None:
        self.dataset = dataset
        self.indices: list[int] = indices.tolist()

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, object]:
        index = self.indices[position]
        return index, read_item(self.dataset, index)


def nonfinite_problem(index: int, x: torch.Tensor, y: torch.Tensor) -> str | None:
    """Why dataset item ``index`` cannot be trained on because of NaN or infinite values, or ``None``."""
    for what, t in (("input", x), ("label", y)):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = t[~torch.isfinite(t)].reshape(-1)[0].item()
            return (
                f"dataset item {index}: its {what} holds a non-finite value ({bad}); [data] check refuses NaN "
                "and infinity"
            )
    return None


@dataclass(frozen=True)
class Collate:
    """Checks and stacks a batch of raw items (in the loader's workers) into a :data:`Pair`.

    ``dtype``: floating inputs are cast to it; ``None`` leaves them as the dataset made them (a loader's batch is
    cast on the device, after its copy: a dataset of bfloat16 items crosses to the device at half the bytes).

    Raises:
        ConfigError: an item that cannot be read or does not fit :attr:`spec` (naming it).
    """

    spec: ItemSpec
    dtype: torch.dtype | None
    inputs: bool
    labels: bool

    def __call__(self, items: list[tuple[int, object]]) -> Pair:
        xs, ys = [], []
        for index, item in items:
            x, y = _as_pair(index, item)
            reason = self.spec.check(index, x, y)
            if reason is not None:
                raise ConfigError(reason)
            xs.append(x)
            ys.append(y)
        # default_collate stacks into shared memory when it runs in a loader worker, so the batch reaches the
        # training process without the extra copy torch.stack's private result takes on its way there
        x_all = torch.utils.data.default_collate(xs) if self.inputs else None
        if x_all is not None and self.dtype is not None:
            x_all = cast_floating(x_all, self.dtype)
        return x_all, torch.utils.data.default_collate(ys) if self.labels else None


def read_inputs(dataset: MapDataset, indices: Sequence[int], spec: ItemSpec, dtype: torch.dtype) -> torch.Tensor:
    """The inputs of the dataset items ``indices``, read, checked against ``spec`` and stacked in this process
    (floating ones cast to ``dtype``)."""
    items = [(int(i), read_item(dataset, int(i))) for i in indices]
    x, _ = Collate(spec, dtype, inputs=True, labels=False)(items)
    assert x is not None
    return x


@dataclass(frozen=True)
class Scan:
    """The up-front check of a batch of raw items (in the loader's workers; a step never pays for it): the first
    failure ``(index, reason)``, or ``None``. Besides :attr:`spec`, no NaN or infinity, and each item's label equal
    to ``table``'s (the dataset's :func:`label_table`, by dataset index) when given."""

    spec: ItemSpec
    table: torch.Tensor | None = None

    def __call__(self, items: list[tuple[int, object]]) -> tuple[int, str] | None:
        for index, item in items:
            try:
                x, y = _as_pair(index, item)
            except ConfigError as exc:
                return index, str(exc)
            reason = self.spec.check(index, x, y)
            if reason is None:
                reason = nonfinite_problem(index, x, y)
            if reason is None and self.table is not None and not torch.equal(y, self.table[index]):
                reason = (
                    f"dataset item {index}: label {y.tolist()} differs from the dataset's targets/labels "
                    f"({self.table[index].tolist()}), which a step reads when only labels are needed"
                )
            if reason is not None:
                return index, reason
        return None


def cast_floating(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to ``dtype`` when it is floating (integer inputs, token ids say, stay as they are)."""
    return x.to(dtype) if x.is_floating_point() else x
