"""Load a script of the repository (a benchmark, an example) as a module, for the tests that call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The repository's root.
ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The script at ``path`` (absolute, or relative to the repository's root) run as the module ``name`` (default:
    its file name without ``.py``), registered in ``sys.modules`` so that its dataclasses and pickles resolve."""
    path = path if path.is_absolute() else ROOT / path
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
