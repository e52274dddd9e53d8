"""Docs and examples stay in working order: relative links resolve, every example and benchmark compiles."""

from __future__ import annotations

import py_compile
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    missing = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+://|^#|^mailto:", target):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{page.name} links to missing files: {missing}"


SCRIPTS = sorted([*(ROOT / "examples").glob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_compiles(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pyc"
    py_compile.compile(str(script), cfile=str(out), doraise=True)
    assert out.stat().st_size > 0


def test_readme_python_snippets_run(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README should show the Python API"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})  # the README's own words, run as written
    out = capsys.readouterr().out
    for line in re.findall(r"# (\[.*?\]|\(.*?\))\s*$", "\n".join(blocks), flags=re.M):
        assert line in out, f"README promises {line} but the snippet printed:\n{out}"
