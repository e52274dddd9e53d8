"""The one lookup of a name a config gives (:func:`resolve`): a registry name, or ``"package.module:attribute"``
imported in the process that resolves it, with the config key that names each kind of object (:data:`KEYS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TypeVar, cast

from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["KEYS", "T", "resolve"]

T = TypeVar("T")

#: What is looked up -> the config key that names it (error messages name the key).
KEYS = {
    "model": "[model] name",
    "dataset": "[data] dataset",
    "eval dataset": "[data] eval_dataset",
    "freeze policy": "[freeze] policy",
    "partition solver": "[pipeline] solver",
    "compression rule": "[pipeline] compression",
}


def resolve(spec: str, registry: Mapping[str, T], kind: str) -> T:
    """A registry entry by name, or any object by import path ``"module:attribute"``.

    Args:
        spec: a key of ``registry``, or ``"package.module:attr"`` (dots after the colon walk attributes).
        registry: the built-in names.
        kind: what is looked up, for the error message ("freeze policy", "model", ...).

    Raises:
        ConfigError: an unknown name (listing the valid ones), or an import path that does not import (one line
            naming the config key and the module; ``elastic-pipe train`` puts the current directory and the
            config file's directory on ``sys.path``, as ``python -m`` and torchrun put the script's).
    """
    if ":" not in spec:
        if spec not in registry:
            raise ConfigError(
                f"unknown {kind} {spec!r}; expected one of {', '.join(sorted(registry))} or 'module:attribute'"
            )
        return registry[spec]
    module_name, _, attr = spec.partition(":")
    key = KEYS.get(kind, kind)
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{kind} {spec!r} ({key}): cannot import {module_name!r}: {exc}; it must be importable from the current "
            "directory, the config file's directory or PYTHONPATH"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"{kind} {spec!r} ({key}): importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not part or not hasattr(obj, part):
            raise ConfigError(f"{kind} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return cast("T", obj)  # an imported object: each caller checks it is what it asked for
