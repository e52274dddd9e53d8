"""Argument checks that public functions run at entry, raising their own package's errors.

Every primitive builds one :class:`Checks` bound to its two error classes - the out-of-range one (a
``ValueError``) and the wrong-type one (a ``TypeError``), both :class:`~elastic_pipe.types.ElasticPipeError`
subclasses - so a bad argument reads the same everywhere ("stages must be an int, got 'x'") and a caller can catch
the package's family, the toolkit's root or the builtin exception it already catches.

This module imports nothing from the toolkit, so every primitive may import it (the layering rules treat it like
:mod:`elastic_pipe.types`). The checks cost a few ``isinstance`` calls: run them once per public call, never per
element of a hot loop.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from types import UnionType
from typing import Any, TypeVar, get_args, overload

__all__ = ["INT64_MAX", "Checks"]

#: The default upper bound of an integer argument: the largest int64, so any count a tensor, a seed or a file can
#: hold passes and a value such as ``10**30`` is refused before it reaches a loop or an allocation. Functions whose
#: work grows with an argument set their own, tighter bound.
INT64_MAX = 2**63 - 1

T = TypeVar("T")


class Checks:
    """The argument checks of one package: ``invalid`` for a value out of range, ``wrong_type`` for a wrong type.

    Each check returns the value (as a plain ``int``, ``float``, ``str`` or list) so a call site reads
    ``stages = CHECK.int("stages", stages, lo=1)``. ``integer`` is how the package's messages name an int (``"an
    int"`` or ``"an integer"``), so the checks read like the package's other messages.
    """

    def __init__(self, invalid: type[Exception], wrong_type: type[Exception], integer: builtins.str = "an int") -> None:
        self.invalid = invalid
        self.wrong_type = wrong_type
        self.integer = integer

    def int(
        self,
        name: builtins.str,
        value: object,
        lo: builtins.int = 0,
        hi: builtins.int = INT64_MAX,
        *,
        none: bool = False,
    ) -> builtins.int:
        """``value`` as an int in ``[lo, hi]`` (a bool is not an int here; numpy integers are)."""
        expected = f"{name} must be {self.integer} {_range(lo, hi, INT64_MAX)}{' or None' if none else ''}"
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise self.wrong_type(f"{expected}, got {_show(value)}")
        number = builtins.int(value)
        if number < lo:
            raise self.invalid(f"{name} must be {self.integer} >= {lo}, got {number}")
        if number > hi:
            raise self.invalid(f"{name} must be {self.integer} <= {hi}, got {number}")
        return number

    def optional_int(
        self, name: builtins.str, value: object, lo: builtins.int = 0, hi: builtins.int = INT64_MAX
    ) -> builtins.int | None:
        """``None``, or ``value`` checked by :meth:`int`."""
        return None if value is None else self.int(name, value, lo, hi, none=True)

    def float(
        self,
        name: builtins.str,
        value: object,
        lo: builtins.float = 0.0,
        hi: builtins.float = math.inf,
        *,
        finite: builtins.bool = True,
        none: builtins.bool = False,
    ) -> builtins.float:
        """``value`` as a float in ``[lo, hi]``; NaN is always refused, infinity unless ``finite`` is false."""
        kind = "a finite number" if finite else "a number"
        expected = f"{name} must be {kind} {_range(lo, hi, math.inf)}{' or None' if none else ''}"
        if isinstance(value, bool) or not isinstance(value, Real):
            raise self.wrong_type(f"{expected}, got {_show(value)}")
        number = builtins.float(value)
        if math.isnan(number) or (finite and math.isinf(number)) or not lo <= number <= hi:
            raise self.invalid(f"{expected}, got {number}")
        return number

    def number(self, name: builtins.str, value: object) -> builtins.float:
        """``value`` as a float if it is a real number, NaN and infinity included (for a caller whose own range
        check follows)."""
        if isinstance(value, bool) or not isinstance(value, Real):
            raise self.wrong_type(f"{name} must be a number, got {_show(value)}")
        return builtins.float(value)

    def optional_float(self, name: builtins.str, value: object) -> builtins.float | None:
        """``None``, or ``value`` checked by :meth:`float` (a finite number >= 0)."""
        return None if value is None else self.float(name, value, none=True)

    def str(self, name: builtins.str, value: object) -> builtins.str:
        """``value`` if it is a string."""
        if not isinstance(value, builtins.str):
            raise self.wrong_type(f"{name} must be a string, got {_show(value)}")
        return value

    @overload
    def instance(self, name: builtins.str, value: object, kind: type[T]) -> T: ...

    @overload
    def instance(self, name: builtins.str, value: object, kind: UnionType) -> object: ...

    def instance(self, name: builtins.str, value: object, kind: type[T] | UnionType) -> object:
        """``value`` if it is an instance of ``kind`` (a class or a union such as ``str | Path``)."""
        if not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in get_args(kind)) if isinstance(kind, UnionType) else kind.__name__
            raise self.wrong_type(f"{name} must be a {names}, got {_show(value)}")
        return value

    def mapping(self, name: builtins.str, value: object) -> Mapping[Any, Any]:
        """``value`` if it is a mapping (a dict or any ``collections.abc.Mapping``)."""
        if not isinstance(value, Mapping):
            raise self.wrong_type(f"{name} must be a mapping, got {_show(value)}")
        return value

    def callable(self, name: builtins.str, value: T) -> T:
        """``value`` if it can be called."""
        if not builtins.callable(value):
            raise self.wrong_type(f"{name} must be callable, got {_show(value)}")
        return value

    def items(self, name: builtins.str, values: object, *, empty: builtins.bool = False) -> list[Any]:
        """``values`` (any iterable but a string, bytes or a mapping) as a list; refused if empty unless
        ``empty``."""
        if isinstance(values, builtins.str | bytes | dict) or not isinstance(values, Iterable):
            raise self.wrong_type(f"{name} must be a sequence, got {_show(values)}")
        items = list(values)
        if not items and not empty:
            raise self.invalid(f"{name} is empty")
        return items

    def ints(
        self,
        name: builtins.str,
        values: object,
        lo: builtins.int = 0,
        hi: builtins.int = INT64_MAX,
        *,
        empty: builtins.bool = False,
    ) -> list[builtins.int]:
        """``values`` as a list of ints, each checked by :meth:`int` (named ``name[i]``)."""
        return [self.int(f"{name}[{i}]", v, lo, hi) for i, v in enumerate(self.items(name, values, empty=empty))]

    def floats(self, name: builtins.str, values: object, *, empty: builtins.bool = False) -> list[builtins.float]:
        """``values`` as a list of floats, each checked by :meth:`float` (named ``name[i]``)."""
        return [self.float(f"{name}[{i}]", v) for i, v in enumerate(self.items(name, values, empty=empty))]


def _range(lo: float, hi: float, top: float) -> str:
    """``">= lo"`` when ``hi`` is the default ``top``, else ``"in [lo, hi]"`` (numbers as Python writes them, with
    no trailing ``.0``)."""
    low = f"{lo:g}" if isinstance(lo, float) and lo.is_integer() else repr(lo)
    if hi == top:
        return f">= {low}"
    high = f"{hi:g}" if isinstance(hi, float) and hi.is_integer() else repr(hi)
    return f"in [{low}, {high}]"


def _show(value: object) -> builtins.str:
    """A short description of a bad value: its repr (cut to 60 characters) and, for non-builtins, its type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = type(value)
    return text if kind.__module__ == "builtins" else f"{text} ({kind.__name__})"
