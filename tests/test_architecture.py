"""The layering rules, checked on the imports of every module.

* A primitive imports only itself, :mod:`elastic_pipe.types` (directly, or as ``from elastic_pipe import types``;
  the package root re-exports nothing but the shared types and the version) and :mod:`elastic_pipe._checks` (the
  shared argument checks, which import nothing of the toolkit).
* The planner composes primitives: it may import any primitive, the shared types and itself, never the
  orchestrator or the CLI (they build on it, not the other way round).
* The trainer integrations (:mod:`elastic_pipe.integrations`) build on the primitives like the planner, and never
  import the orchestrator, the planner or the CLI: a callback in someone's HF or Lightning script needs none of them.
* :mod:`elastic_pipe.testing` (helpers a user's tests can rely on) imports only the shared types: it runs a
  function in processes and knows nothing of what the function does.
* No import circles anywhere in the package, measured by ``benchmarks/import_graph.py`` (which also prints the
  floors and arrows).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

import elastic_pipe
from script_module import load_script

PACKAGE = Path(elastic_pipe.__file__).resolve().parent
PRIMITIVES = ("freeze", "partition", "schedule", "groups", "protocol", "cache", "data", "models")
#: What any layer may import from the toolkit besides itself: the root (its version), the shared types and the
#: shared argument checks.
SHARED = {"elastic_pipe", "elastic_pipe.types", "elastic_pipe._checks"}
#: What each composing or helper package may import besides itself and :data:`SHARED`.
ALLOWED = {
    "planner": {f"elastic_pipe.{p}" for p in PRIMITIVES},
    "integrations": {f"elastic_pipe.{p}" for p in PRIMITIVES},
    "testing": set(),
}


def _import_graph() -> ModuleType:
    """``benchmarks/import_graph.py``, the import-graph measurement."""
    return load_script(Path("benchmarks/import_graph.py"))


def _submodule(name: str) -> bool:
    """Whether ``elastic_pipe.<name>`` is a module or package (rather than an attribute of the root)."""
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def _toolkit_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("elastic_pipe"))
        elif isinstance(node, ast.ImportFrom) and node.module == "elastic_pipe" and node.level == 0:
            # ``from elastic_pipe import partition`` imports the package ``elastic_pipe.partition``.
            found.update(f"elastic_pipe.{a.name}" if _submodule(a.name) else "elastic_pipe" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("elastic_pipe"):
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 1:
            found.add(f"<relative import {'.' * node.level}{node.module or ''} leaves the package>")
    return found


def _outside(package: str, allowed: set[str]) -> dict[str, set[str]]:
    """Per module of ``elastic_pipe.<package>``, the toolkit imports outside itself, :data:`SHARED` and
    ``allowed`` (a name is allowed with everything below it)."""
    own = f"elastic_pipe.{package}"
    roots = {own, *allowed}
    offenders: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        bad = {
            m
            for m in _toolkit_imports(path)
            if m not in SHARED and not any(m == r or m.startswith(r + ".") for r in roots)
        }
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    return offenders


@pytest.mark.parametrize("primitive", PRIMITIVES)
def test_primitive_imports_only_itself_and_shared_types(primitive: str) -> None:
    offenders = _outside(primitive, set())
    assert not offenders, f"{primitive} imports other parts of the toolkit: {offenders}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_planner_and_testing_keep_to_their_layer(package: str) -> None:
    offenders = _outside(package, ALLOWED[package])
    assert not offenders, f"{package} imports what it may not: {offenders}"


def test_the_shared_modules_import_nothing_of_the_toolkit() -> None:
    # types.py and _checks.py are what every primitive may import, so they must not pull a primitive in themselves.
    assert _toolkit_imports(PACKAGE / "_checks.py") == set()
    assert _toolkit_imports(PACKAGE / "types.py") == set()


def test_every_primitive_has_a_docstring() -> None:
    for primitive in PRIMITIVES:
        tree = ast.parse((PACKAGE / primitive / "__init__.py").read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and len(doc) > 40, f"elastic_pipe.{primitive} needs a docstring saying what it owns"


def test_the_checker_catches_a_cross_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from elastic_pipe.partition import solve\nimport elastic_pipe.types\n")
    assert _toolkit_imports(bad) == {"elastic_pipe.partition", "elastic_pipe.types"}


def test_the_checker_catches_a_primitive_imported_from_the_root(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from elastic_pipe import partition, types\nfrom elastic_pipe import ElasticPipeError\n")
    assert _toolkit_imports(bad) == {"elastic_pipe.partition", "elastic_pipe.types", "elastic_pipe"}


def test_the_rules_reject_what_they_should(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake toolkit tree: a primitive importing another from the root, a planner importing the orchestrator.
    for name in (*PRIMITIVES, "planner", "orchestrator", "cli", "testing", "integrations"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text('"""x"""\n')
    (tmp_path / "types.py").write_text("")
    (tmp_path / "freeze" / "bad.py").write_text("from elastic_pipe import partition\n")
    (tmp_path / "planner" / "bad.py").write_text("from elastic_pipe.orchestrator import layout\n")
    (tmp_path / "planner" / "good.py").write_text("from elastic_pipe import freeze, types\n")
    (tmp_path / "testing" / "bad.py").write_text("import elastic_pipe.groups\n")
    (tmp_path / "integrations" / "bad.py").write_text("from elastic_pipe.orchestrator import trainer\n")
    (tmp_path / "integrations" / "good.py").write_text("from elastic_pipe import freeze\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert _outside("freeze", set()) == {"freeze/bad.py": {"elastic_pipe.partition"}}
    assert _outside("planner", ALLOWED["planner"]) == {"planner/bad.py": {"elastic_pipe.orchestrator"}}
    assert _outside("testing", ALLOWED["testing"]) == {"testing/bad.py": {"elastic_pipe.groups"}}
    assert _outside("integrations", ALLOWED["integrations"]) == {"integrations/bad.py": {"elastic_pipe.orchestrator"}}


def test_the_package_has_no_import_circles() -> None:
    graph = _import_graph()
    numbers = graph.measure(graph.graph(PACKAGE))
    assert numbers.circles == [] and numbers.arrows_back_up == 0, f"import circles: {numbers.circles}"


def test_the_import_graph_finds_circles_and_floors(tmp_path: Path) -> None:
    graph = _import_graph()
    pkg = tmp_path / "elastic_pipe"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "types.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from elastic_pipe.sub import a\n")
    (pkg / "sub" / "a.py").write_text("from elastic_pipe.sub import b\nfrom elastic_pipe import types\n")
    (pkg / "sub" / "b.py").write_text("from . import a\nfrom typing import TYPE_CHECKING\n")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    numbers = graph.measure(graph.graph(pkg))
    assert numbers.circles == [["elastic_pipe.sub.a", "elastic_pipe.sub.b"]]
    # types on floor 0, the circle a <-> b on floor 1, sub's face on floor 2; c imports a only for type checking
    assert (numbers.modules, numbers.floors, numbers.arrows, numbers.arrows_back_up) == (6, 3, 4, 2)
    inside = graph.measure(graph.scoped(graph.graph(pkg), "elastic_pipe.sub"))
    assert (inside.modules, inside.floors, inside.arrows) == (4, 2, 3)  # the circle on floor 0 here


#: The orchestrator's import floors, module by module and part by part (a subpackage or a top-level module one
#: node), as measured when they were last lowered: a change may lower them, never raise them (issue 42 asks for at
#: most 10 module floors; the subpackages' faces each add one).
ORCHESTRATOR_FLOORS, ORCHESTRATOR_PART_FLOORS = 10, 8


def _orchestrator_parts() -> dict[str, set[str]]:
    graph = _import_graph()
    return graph.parts(graph.graph(PACKAGE), "elastic_pipe.orchestrator")


def test_the_orchestrators_parts_have_no_circles_and_keep_their_floors() -> None:
    graph = _import_graph()
    parts = graph.measure(_orchestrator_parts())
    assert parts.circles == [], f"parts of the orchestrator import each other: {parts.circles}"
    assert parts.floors <= ORCHESTRATOR_PART_FLOORS
    modules = graph.measure(graph.scoped(graph.graph(PACKAGE), "elastic_pipe.orchestrator"))
    assert modules.floors <= ORCHESTRATOR_FLOORS, f"{modules.floors} import floors in the orchestrator"


def test_docs_list_every_arrow_between_the_orchestrators_parts() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("### The parts and their imports", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    listed = {}
    for line in section.strip().splitlines():
        part, _, targets = line.partition(" -> ")
        listed[part] = set() if targets == "-" else set(targets.split(", "))
    assert listed == _orchestrator_parts()


def test_the_parts_graph_squeezes_subpackages(tmp_path: Path) -> None:
    graph = _import_graph()
    pkg = tmp_path / "elastic_pipe"
    (pkg / "orchestrator" / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "orchestrator" / "__init__.py").write_text("from elastic_pipe.orchestrator import top\n")
    (pkg / "orchestrator" / "top.py").write_text("from elastic_pipe.orchestrator.sub import a\n")
    (pkg / "orchestrator" / "sub" / "__init__.py").write_text("from elastic_pipe.orchestrator.sub import a\n")
    (pkg / "orchestrator" / "sub" / "a.py").write_text("from elastic_pipe.orchestrator.sub import b\n")
    (pkg / "orchestrator" / "sub" / "b.py").write_text("")
    parts = graph.parts(graph.graph(pkg), "elastic_pipe.orchestrator")
    assert parts == {"__init__": {"top"}, "top": {"sub"}, "sub": set()}  # a -> b stays inside sub
