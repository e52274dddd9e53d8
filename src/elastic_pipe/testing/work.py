"""Count the work a piece of training code does: forwards per sub-layer, cache writes, dataset reads, bytes copied.

A transition that freezes ``k`` more units over a complete activation cache should run only those units, once per
cached entry, and copy nothing else (issue 40). Its wall time on a GPU says whether it did more; on a CPU the same
question is answered by counting. :func:`count_work` is a context manager that, while it is open, counts

* per sub-layer of a model (its direct children: a :class:`~elastic_pipe.models.SubLayerModel`'s sub-layers), the
  forward calls and the rows (the first dimension of the first tensor argument: samples) through it;
* the activation cache's writes: entries and bytes stored by ``put`` (new entries) and by ``extend`` (entries
  carried in place to a new boundary), and entries read by ``get``;
* the dataset's items read (a :class:`CountedDataset`'s ``__getitem__`` calls);
* the bytes ``torch.distributed`` copies between ranks, per operation (sent, received, broadcast, all-gathered),
  and the number of one-element signals (flags and counts that collectives agree on);
* the calls of functions the caller names (``calls``: e.g. the stage runtime's ``build_runner``, to count the
  schedule runners a transition builds).

Work can be put into a named part (``with work.part("probe"): ...``): everything counted inside goes to that part,
so a test can separate, say, the freeze probe's forwards from the transition's own.

Example::

    with count_work(trainer.ctx.model, cache=trainer.prefix.cache, dataset=data) as work:
        trainer.transition()
    assert work.total.rows[5] == cached_entries

Everything it patches (the ``torch.distributed`` functions, the cache's methods on that one object, the named
functions) is put back when the block ends; the counts stay readable after it. It imports nothing of the toolkit
(:mod:`elastic_pipe.testing` knows nothing of what it runs): what to count is handed to it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["CountedDataset", "PartCount", "WorkCount", "count_work"]

#: The part counted when no other is open (:meth:`WorkCount.part`).
MAIN = "main"
#: ``torch.distributed`` functions whose tensors are counted: name -> how the bytes are attributed.
_OPS = (
    "send",
    "recv",
    "isend",
    "irecv",
    "broadcast",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "gather",
    "scatter",
    "reduce_scatter_tensor",
)


class CountedDataset(torch.utils.data.Dataset[Any]):
    """A map-style dataset that counts the items read from it (``dataset[i]``), for :func:`count_work`.

    Args:
        dataset: the dataset read (``len`` and ``[]``); its ``random_augmentation`` is passed on.

    Attributes:
        reads: items read so far (in this process: a ``DataLoader`` with workers reads in other processes).
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.random_augmentation = bool(getattr(dataset, "random_augmentation", False))
        self.reads = 0
        #: The counts of the open :func:`count_work` block that counts this dataset's reads, if any.
        self.work: WorkCount | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        self.reads += 1
        if self.work is not None:
            self.work.now.items_read += 1
        return self.dataset[index]


@dataclass
class PartCount:
    """What one part of the counted code did (see the module docstring).

    Attributes:
        calls: forward calls per sub-layer, by index.
        rows: rows (samples) through each sub-layer.
        cache_put: cache entries newly stored by ``put``.
        cache_put_bytes: their bytes, as stored.
        cache_carried: cache entries carried in place to a new boundary by ``extend``.
        cache_carried_bytes: their bytes at the new boundary, as stored.
        cache_got: cache entries looked up by ``get`` (hits and misses).
        items_read: dataset items read (:class:`CountedDataset`).
        copied: bytes per ``torch.distributed`` operation: ``send`` (sent), ``recv`` (received), ``broadcast_sent``
            and ``broadcast_received`` (by this rank's role), ``all_gather`` (received from the other ranks),
            ``all_reduce`` and ``gather`` (the tensor's bytes); one-element tensors are not copies but signals.
        signals: collectives and point-to-point calls on one-element tensors (flags and counts).
        control_bytes: bytes of the operations on the ``control`` group of :func:`count_work` (decisions, flags,
            statistics: the run's bookkeeping, not its data).
        called: calls of each function named in ``count_work(calls=...)``, by its key.
    """

    calls: list[int]
    rows: list[int]
    cache_put: int = 0
    cache_put_bytes: int = 0
    cache_carried: int = 0
    cache_carried_bytes: int = 0
    cache_got: int = 0
    items_read: int = 0
    copied: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    signals: int = 0
    control_bytes: int = 0
    called: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @classmethod
    def empty(cls, sublayers: int) -> PartCount:
        """Nothing counted yet, for a model of ``sublayers`` sub-layers."""
        return cls([0] * sublayers, [0] * sublayers)

    @property
    def copied_bytes(self) -> int:
        """Bytes copied between ranks, every operation together."""
        return sum(self.copied.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for a rank's result to travel to the test process)."""
        return {
            "calls": list(self.calls),
            "rows": list(self.rows),
            "cache_put": self.cache_put,
            "cache_put_bytes": self.cache_put_bytes,
            "cache_carried": self.cache_carried,
            "cache_carried_bytes": self.cache_carried_bytes,
            "cache_got": self.cache_got,
            "items_read": self.items_read,
            "copied": dict(self.copied),
            "signals": self.signals,
            "control_bytes": self.control_bytes,
            "called": dict(self.called),
        }


class WorkCount:
    """The counts of one :func:`count_work` block, by part (see :meth:`part`).

    Args:
        sublayers: the number of sub-layers counted.
    """

    def __init__(self, sublayers: int) -> None:
        self.sublayers = sublayers
        self.parts: dict[str, PartCount] = {MAIN: PartCount.empty(sublayers)}
        self._current = MAIN

    @property
    def now(self) -> PartCount:
        """The part being counted now."""
        return self.parts[self._current]

    @property
    def total(self) -> PartCount:
        """The part counted outside every :meth:`part` block."""
        return self.parts[MAIN]

    def __getitem__(self, name: str) -> PartCount:
        """The part ``name`` (empty when nothing was counted in it)."""
        return self.parts.get(name) or PartCount.empty(self.sublayers)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count what runs inside the block in part ``name`` instead of the enclosing one."""
        previous = self._current
        self.parts.setdefault(name, PartCount.empty(self.sublayers))
        self._current = name
        try:
            yield
        finally:
            self._current = previous

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every part as plain data."""
        return {name: p.to_dict() for name, p in self.parts.items()}


def _rows_of(args: tuple[Any, ...]) -> int:
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else 1


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _group_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``group`` a ``torch.distributed`` call was given (keyword, or positional where the signature has it)."""
    if "group" in kwargs:
        return kwargs["group"]
    position = {"send": 3, "recv": 3, "isend": 3, "irecv": 3, "broadcast": 2, "all_reduce": 2}.get(name)
    return args[position] if position is not None and len(args) > position else None


def _counting_op(name: str, original: Callable[..., Any], work: WorkCount, control: Any) -> Callable[..., Any]:
    """``original`` (a ``torch.distributed`` function) counting its tensors' bytes into ``work``."""

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        part = work.now
        tensors = _tensors(args[0] if args else kwargs.get("tensor", kwargs.get("output_tensor")))
        if control is not None and _group_of(name, args, kwargs) is control:
            part.control_bytes += sum(map(_nbytes, tensors))
            return original(*args, **kwargs)
        if name.startswith("all_gather"):  # (output, input): what the other ranks contributed
            inp = _tensors(args[1] if len(args) > 1 else kwargs.get("input_tensor", kwargs.get("tensor")))
            size = sum(map(_nbytes, tensors)) - sum(map(_nbytes, inp))
            key = "all_gather"
        else:
            size = sum(map(_nbytes, tensors))
            key = name.removeprefix("i")
            if name == "broadcast":
                src = args[1] if len(args) > 1 else kwargs.get("src")
                key = "broadcast_sent" if src == dist.get_rank() else "broadcast_received"
        if sum(t.numel() for t in tensors) <= 1:
            part.signals += 1
        else:
            part.copied[key] += size
        return original(*args, **kwargs)

    return counted


def _patch_distributed(work: WorkCount, control: Any, stack: contextlib.ExitStack) -> None:
    """Count every listed ``torch.distributed`` function, wherever a module of this package bound it by name."""
    originals = {name: getattr(dist, name) for name in _OPS if hasattr(dist, name)}
    by_id = {id(fn): name for name, fn in originals.items()}
    counted = {name: _counting_op(name, fn, work, control) for name, fn in originals.items()}
    holders: list[tuple[Any, str, Any]] = [(dist, name, fn) for name, fn in originals.items()]
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("elastic_pipe."):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in by_id and module is not dist:
                holders.append((module, attr, value))
    for holder, attr, value in holders:
        setattr(holder, attr, counted[by_id[id(value)]])
        stack.callback(setattr, holder, attr, value)


def _patch_cache(cache: Any, work: WorkCount, stack: contextlib.ExitStack) -> None:
    """Count ``cache``'s ``put``, ``extend`` and ``get`` (on that object only)."""
    put, extend, get = cache.put, cache.extend, cache.get

    def counted_put(sample_ids: torch.Tensor, boundary: int, values: torch.Tensor) -> int:
        stored = int(put(sample_ids, boundary, values))
        part = work.now
        part.cache_put += stored
        if values.dim() > 0 and values.shape[0]:
            part.cache_put_bytes += stored * values[0].numel() * cache.stored_dtype(values.dtype).itemsize
        return stored

    def counted_extend(old: int, new: int, fn: Callable[[torch.Tensor], torch.Tensor], **kwargs: Any) -> int:
        def carried(v: torch.Tensor) -> torch.Tensor:
            out = fn(v)
            part = work.now
            part.cache_carried += int(out.shape[0])
            part.cache_carried_bytes += out.numel() * cache.stored_dtype(out.dtype).itemsize
            return out

        return int(extend(old, new, carried, **kwargs))

    def counted_get(sample_ids: torch.Tensor, boundary: int) -> Any:
        work.now.cache_got += int(sample_ids.numel())
        return get(sample_ids, boundary)

    for attr, fn in (("put", counted_put), ("extend", counted_extend), ("get", counted_get)):
        setattr(cache, attr, fn)
        stack.callback(delattr, cache, attr)


def _patch_calls(calls: Mapping[str, tuple[Any, str]], work: WorkCount, stack: contextlib.ExitStack) -> None:
    """Count the calls of ``holder.name`` for every ``key: (holder, name)`` of ``calls``."""
    for key, (holder, name) in calls.items():
        original = getattr(holder, name)

        def counted(*args: Any, _key: str = key, _fn: Any = original, **kwargs: Any) -> Any:
            work.now.called[_key] += 1
            return _fn(*args, **kwargs)

        setattr(holder, name, counted)
        stack.callback(setattr, holder, name, original)


@contextlib.contextmanager
def count_work(
    model: nn.Module,
    *,
    cache: Any = None,
    dataset: CountedDataset | None = None,
    control: Any = None,
    calls: Mapping[str, tuple[Any, str]] | None = None,
) -> Iterator[WorkCount]:
    """Count the work done inside the block (see the module docstring).

    Args:
        model: the model whose direct children (sub-layers) are counted.
        cache: an :class:`~elastic_pipe.cache.ActivationCache` whose writes and reads are counted (``None``: none).
        dataset: a :class:`CountedDataset` whose reads are counted (``None``: none).
        control: a process group whose operations count as bookkeeping (:attr:`PartCount.control_bytes`), not
            copies: the run's control group.
        calls: ``key: (holder, name)``: count the calls of ``holder.name`` (a module's function, an object's
            method) under ``key`` in :attr:`PartCount.called`; the callers must look it up on ``holder`` when they
            call it (``module.fn(...)``, not a name imported before the block).

    Yields:
        The counts, filled in as the block runs.
    """
    sublayers = list(model.children())
    work = WorkCount(len(sublayers))

    def hook(index: int, module: nn.Module, args: tuple[Any, ...]) -> None:
        part = work.now
        part.calls[index] += 1
        part.rows[index] += _rows_of(args)

    with contextlib.ExitStack() as stack:
        for j, m in enumerate(sublayers):
            stack.callback(m.register_forward_pre_hook(functools.partial(hook, j)).remove)
        _patch_distributed(work, control, stack)
        if cache is not None:
            _patch_cache(cache, work, stack)
        _patch_calls(calls or {}, work, stack)
        if dataset is not None:
            dataset.work = work
            stack.callback(setattr, dataset, "work", None)
        yield work
