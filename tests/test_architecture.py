"""The layering rules: primitives never import each other; only orchestrator, planner and CLI compose them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import elastic_pipe

PACKAGE = Path(elastic_pipe.__file__).resolve().parent
PRIMITIVES = ("freeze", "partition", "schedule", "groups", "protocol", "cache", "data", "models")
#: What a primitive may import from the toolkit besides itself.
SHARED = {"elastic_pipe", "elastic_pipe.types"}


def _toolkit_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("elastic_pipe"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("elastic_pipe"):
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 1:
            found.add(f"<relative import {'.' * node.level}{node.module or ''} leaves the package>")
    return found


@pytest.mark.parametrize("primitive", PRIMITIVES)
def test_primitive_imports_only_itself_and_shared_types(primitive: str) -> None:
    own = f"elastic_pipe.{primitive}"
    offenders: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / primitive).rglob("*.py")):
        bad = {m for m in _toolkit_imports(path) if m not in SHARED and not (m == own or m.startswith(own + "."))}
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert not offenders, f"{primitive} imports other parts of the toolkit: {offenders}"


def test_every_primitive_has_a_docstring() -> None:
    for primitive in PRIMITIVES:
        tree = ast.parse((PACKAGE / primitive / "__init__.py").read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and len(doc) > 40, f"elastic_pipe.{primitive} needs a docstring saying what it owns"


def test_the_checker_catches_a_cross_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from elastic_pipe.partition import solve\nimport elastic_pipe.types\n")
    assert _toolkit_imports(bad) == {"elastic_pipe.partition", "elastic_pipe.types"}
