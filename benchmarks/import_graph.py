"""The package's import graph, measured: floors, arrows, arrows back up and circles, for the orchestrator and the
whole package.

Usage::

    PYTHONPATH=src python benchmarks/import_graph.py [--json]

Every module is a node (a package is its ``__init__``); an arrow is one module importing another of the toolkit,
anywhere in the module (a function's local import counts: it runs), except under ``if TYPE_CHECKING:`` (it never
runs). ``from elastic_pipe.orchestrator.layout import executor`` is an arrow to the module ``executor`` when it is
one, to the package's ``__init__`` otherwise.

* circles: the strongly connected groups of more than one module (modules that import each other, directly or
  around a ring);
* floors: the levels of the graph with each circle squeezed into one node: a module that imports nothing of the
  scope is on floor 0, any other one floor above the highest it imports;
* arrows back up: arrows to a module on the same floor or higher, which are the arrows inside circles.

The scope ``orchestrator`` counts only the modules of :mod:`elastic_pipe.orchestrator` and the arrows between them.
``--parts`` also prints the orchestrator's parts (each subpackage and each top-level module one node, the package's
own ``__init__`` the part ``__init__``), their floors and every arrow between two parts: the list
docs/training.md keeps ("How the trainer is put together"), checked by the test suite.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = "elastic_pipe"


@dataclass(frozen=True)
class GraphNumbers:
    """What :func:`measure` reports for one scope.

    Attributes:
        modules: the modules in the scope.
        floors: the levels of the graph, circles squeezed into one node.
        arrows: the import arrows between the scope's modules.
        arrows_back_up: arrows to a module on the same floor or higher (inside circles).
        circles: groups of modules that import each other (each a sorted list of names).
    """

    modules: int
    floors: int
    arrows: int
    arrows_back_up: int
    circles: list[list[str]]


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under ``package_dir`` (``elastic_pipe/``), by dotted name."""
    out: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:`` (they never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    lines.add(getattr(sub, "lineno", -1))
    return lines


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The toolkit modules ``name`` (at ``path``) imports at run time."""
    modules = set(known)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", -1) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def graph(package_dir: Path) -> dict[str, set[str]]:
    """The whole package's arrows: each module's imported modules."""
    names = module_names(package_dir)
    return {name: imports_of(name, path, names) for name, path in names.items()}


def _components(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(arrows):
        if start in index:
            continue
        work = [(start, iter(sorted(arrows[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                out.append(sorted(group))
    return out


def measure(arrows: dict[str, set[str]]) -> GraphNumbers:
    """Floors, arrows, arrows back up and circles of the graph ``arrows`` (only arrows between its nodes)."""
    arrows = {m: {t for t in targets if t in arrows} for m, targets in arrows.items()}
    groups = _components(arrows)
    group_of = {m: i for i, g in enumerate(groups) for m in g}
    floor: dict[int, int] = {}
    for i, members in enumerate(groups):  # Tarjan emits a component after every component it reaches
        below = {group_of[t] for m in members for t in arrows[m]} - {i}
        floor[i] = 1 + max((floor[j] for j in below), default=-1)
    back = sum(1 for m, targets in arrows.items() for t in targets if floor[group_of[t]] >= floor[group_of[m]])
    return GraphNumbers(
        modules=len(arrows),
        floors=1 + max(floor.values(), default=-1),
        arrows=sum(len(t) for t in arrows.values()),
        arrows_back_up=back,
        circles=[g for g in groups if len(g) > 1],
    )


def scoped(arrows: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    """The part of ``arrows`` among the modules named ``prefix`` or below it."""
    inside = {m for m in arrows if m == prefix or m.startswith(prefix + ".")}
    return {m: arrows[m] & inside for m in inside}


def parts(arrows: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    """The graph of ``prefix``'s parts: every module under ``prefix.X`` squeezed into the part ``X`` (a subpackage or
    a top-level module), ``prefix`` itself into ``__init__``; an arrow between two modules of one part is dropped."""

    def part(module: str) -> str:
        rest = module.removeprefix(prefix).lstrip(".")
        return rest.split(".", 1)[0] if rest else "__init__"

    inside = scoped(arrows, prefix)
    out: dict[str, set[str]] = {part(m): set() for m in inside}
    for m, targets in inside.items():
        out[part(m)] |= {part(t) for t in targets} - {part(m)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--parts", action="store_true", help="also the orchestrator's parts and their arrows")
    args = parser.parse_args()
    import elastic_pipe

    arrows = graph(Path(elastic_pipe.__file__).resolve().parent)
    orchestrator_parts = parts(arrows, f"{ROOT}.orchestrator")
    report = {
        "orchestrator": measure(scoped(arrows, f"{ROOT}.orchestrator")),
        "orchestrator parts": measure(orchestrator_parts),
        "package": measure(arrows),
    }
    if args.json:
        print(json.dumps({k: asdict(v) for k, v in report.items()}, indent=1))
        return
    for scope, n in report.items():
        print(
            f"{scope}: {n.modules} modules, {n.floors} floors, {n.arrows} arrows, "
            f"{n.arrows_back_up} arrows back up, {len(n.circles)} circles"
        )
        for circle in n.circles:
            print("  circle: " + " <-> ".join(m.removeprefix(ROOT + ".") for m in circle))
    if args.parts:
        for name, targets in sorted(orchestrator_parts.items()):
            print(f"  {name} -> {', '.join(sorted(targets)) or '-'}")


if __name__ == "__main__":
    main()
