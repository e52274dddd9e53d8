"""The orchestrator's budgets, so that it stays a handful of small, typed parts: no module over
:data:`MAX_LINES` lines, at most :data:`MAX_ANY` uses of ``Any`` and :data:`MAX_IGNORES` ``type: ignore``
comments in all of it (the import graph's floors and circles are ``test_architecture.py``'s)."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

import elastic_pipe

ORCHESTRATOR = Path(elastic_pipe.__file__).resolve().parent / "orchestrator"
MAX_LINES = 300
MAX_ANY = 40
MAX_IGNORES = 8


@dataclass(frozen=True)
class Budget:
    """What the budgets measure over a folder of modules."""

    long_modules: dict[str, int]  #: module -> lines, for every module over MAX_LINES
    any_uses: int  #: ``Any`` read as a name or an attribute (``typing.Any``); imports are not uses
    ignores: int  #: comments that hold ``type: ignore``


def measure(root: Path) -> Budget:
    long_modules: dict[str, int] = {}
    any_uses = ignores = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_LINES:
            long_modules[str(path.relative_to(root))] = lines
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Name) and node.id == "Any") or (
                isinstance(node, ast.Attribute) and node.attr == "Any"
            ):
                any_uses += 1
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and "type: ignore" in tok.string:
                ignores += 1
    return Budget(long_modules, any_uses, ignores)


def test_no_orchestrator_module_is_over_the_line_budget() -> None:
    assert measure(ORCHESTRATOR).long_modules == {}


def test_the_orchestrator_keeps_any_and_type_ignores_within_budget() -> None:
    budget = measure(ORCHESTRATOR)
    assert budget.any_uses <= MAX_ANY, f"{budget.any_uses} uses of Any (budget {MAX_ANY})"
    assert budget.ignores <= MAX_IGNORES, f"{budget.ignores} type: ignore comments (budget {MAX_IGNORES})"


def test_the_measure_counts_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (tmp_path / "typed.py").write_text(
        "import typing\nfrom typing import Any\n\n"
        "def f(a: Any, b: typing.Any) -> dict[str, Any]:  # type: ignore[misc]\n"
        "    return {'Any': a}  # Any in a comment is no use\n",
        encoding="utf-8",
    )
    budget = measure(tmp_path)
    assert budget == Budget({"sub/long.py": MAX_LINES + 1}, any_uses=3, ignores=1)
