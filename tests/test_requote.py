"""benchmarks/requote.py: a re-measure's chore of moving the docs' quotes to the new result files, by the rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from script_module import load_script
from test_doc_numbers import lookup  # how the rows read a number, which the tool is given

ROOT = Path(__file__).resolve().parent.parent
requote = load_script(ROOT / "benchmarks" / "requote.py")


ROWS = [
    ("doc.md", "elastic eager {} s against", "run.json", "arms.elastic", ".2f"),
    ("doc.md", "plain eager\n{} s (3.25x", "run.json", "arms.plain", ".2f"),
    ("doc.md", "ends at {} held-out", "other.json", "acc", ".2%"),
]


def test_moves_each_quoted_number_to_the_new_file_and_leaves_the_rest() -> None:
    doc = "elastic eager 18.04 s against plain eager\n  58.57 s (3.25x over it); elastic eager 18.04 s elsewhere.\n"
    old = {"run.json": {"arms": {"elastic": 18.04, "plain": 58.57}}}
    new = {"run.json": {"arms": {"elastic": 18.32, "plain": 58.26}}}
    out, report = requote.requote(ROWS, lookup, old, new, {"doc.md": doc})
    # the quotes move (whitespace inside the text matches the doc's line break); a bare number, a literal ratio
    # and a row of a file not named stay as they were
    assert out["doc.md"] == (
        "elastic eager 18.32 s against plain eager\n  58.26 s (3.25x over it); elastic eager 18.04 s elsewhere.\n"
    )
    assert "doc.md literals to look for: 18.04 -> 18.32, 58.57 -> 58.26" in report


def test_a_quote_the_doc_lost_is_reported_and_a_moved_one_is_not() -> None:
    old = {"run.json": {"arms": {"elastic": 18.04, "plain": 58.57}}}
    new = {"run.json": {"arms": {"elastic": 18.32, "plain": 58.26}}}
    doc = "elastic eager 18.32 s against, and nothing else"  # the first quote already moved, the second reworded
    out, report = requote.requote(ROWS, lookup, old, new, {"doc.md": doc})
    assert out["doc.md"] == doc
    assert [line for line in report if line.startswith("NOT FOUND")] == [
        "NOT FOUND doc.md: 'plain eager\\n{} s (3.25x' (old 58.57, new 58.26)"
    ]


def test_a_number_the_new_result_lacks_is_left_for_a_hand_rewrite() -> None:
    old = {"run.json": {"arms": {"elastic": 18.04, "plain": 58.57}}}
    new = {"run.json": {"arms": {"elastic": None, "plain": 58.26}}}  # e.g. no time to a target it missed
    doc = "elastic eager 18.04 s against plain eager 58.57 s (3.25x"
    out, report = requote.requote(ROWS, lookup, old, new, {"doc.md": doc})
    assert out["doc.md"] == "elastic eager 18.04 s against plain eager 58.26 s (3.25x"
    assert report[0] == (
        "NO NUMBER doc.md: 'elastic eager {} s against': arms.elastic was 18.04, is now None: rewrite it by hand"
    )


def test_the_command_refuses_a_pair_without_its_files(capsys: Any) -> None:
    assert requote.main(["headline_single.json=/nonexistent.json"]) == 2
    assert "NAME=OLD_PATH" in capsys.readouterr().err
