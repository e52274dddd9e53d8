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


def test_retext_takes_the_literals_the_doc_now_has_around_the_number() -> None:
    doc = "the default 2.16 s against 3.17 s (1.47x: the loop), alpha 1.97 s"  # squashed: one line
    moved = {"2.44": {"3.17"}, "1.42": {"1.47"}}
    # the row still holds the old other side (2.44) and ratio; the re-measure moved both
    text = "default {} s against 2.44 s (1.42x:"
    assert requote.retext(text, "2.16", doc, moved) == "default {} s against 3.17 s (1.47x:"
    assert requote.retext("in " + text, "2.16", doc, moved) is None  # "in " is not there
    # a literal takes only a number it moved to: a ratio edited by hand, or another table that fits, is not guessed
    assert requote.retext(text, "2.16", doc, {"2.44": {"3.17"}}) is None
    cells = "| 97.19% | 219.6 | 1.42x | ... | 97.19% | 206.8 | 1.36x |"
    assert requote.retext("| 219.6 | {}x |", "1.36", cells, {"219.6": {"251.0"}}) is None
    assert requote.retext("{} s against 1.5 s", "2.16", "2.16 s against 1.7 s, 2.16 s against 1.8 s", {}) is None


def test_mend_rows_rewrites_a_stale_row_literal_in_the_source() -> None:
    rows = [
        ("doc.md", "elastic eager {} s against 58.57 s", "run.json", "arms.elastic", ".2f"),
        ("doc.md", "against {} s (3.18x)", "run.json", "arms.plain", ".2f"),  # says 58.57 moved to 58.26
        ("doc.md", "nowhere {} s", "run.json", "arms.elastic", ".2f"),
    ]
    old = {"run.json": {"arms": {"elastic": 18.04, "plain": 58.57}}}
    new = {"run.json": {"arms": {"elastic": 18.32, "plain": 58.26}}}
    source = 'ROWS = [\n    ("doc.md", "elastic eager {} s against 58.57 s", RUN, "arms.elastic", ".2f"),\n]\n'
    docs = {"doc.md": "elastic eager\n  18.32 s against 58.26 s (3.18x)"}
    out, report = requote.mend_rows(rows, lookup, lambda t: " ".join(t.split()), (old, new), docs=docs, source=source)
    assert '"elastic eager {} s against 58.26 s"' in out and "58.57" not in out
    assert report == [
        "row doc.md: 'elastic eager {} s against 58.57 s' -> 'elastic eager {} s against 58.26 s'",
        "ROW BY HAND doc.md: 'nowhere {} s' (run.json: arms.elastic = 18.32)",
    ]
