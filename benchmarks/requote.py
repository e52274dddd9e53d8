"""Move the docs' quoted numbers from a result file's old copy to its re-measured one, by the rows of
``tests/test_doc_numbers.py`` (a chore of every re-measure: docs/benchmarks.md, "The headline, re-measured").

Usage (after the new results are in ``benchmarks/results/`` and the old ones copied aside)::

    python benchmarks/requote.py headline_single.json=/tmp/old/headline_single.json ...

For each row ``(doc, text, file, path, format)`` whose file is named, the number the text quotes is read from the
old copy and from the new file; where they differ, the doc's ``text`` with the old number becomes the text with the
new one (line breaks and indentation inside the text match any whitespace). Only the number changes: prose around
it, numbers the row's text holds literally (a ratio, the other side of a comparison) and the row texts themselves
stay as they were. The report lists every change, every quote not found, every quote whose number one side lacks (an
arm that no longer reached its target has no time to it: the sentence needs rewriting), and the old -> new values
per doc, which are what to look for in those literals; ``pytest tests/test_doc_numbers.py`` then names what is left.
``--rows`` then mends the rows themselves: a row whose text no longer matches its doc because a literal number in it
moved (the other side of a comparison, requoted by its own row or edited by hand) gets the numbers the doc now has
there, where exactly one place in the doc reads as the row's text with other numbers. ``--dry-run`` changes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


NUMBER = r"[+-]?\d+(?:\.\d+)?"


def _loose(part: str, *, any_numbers: bool = False) -> str:
    """A pattern for ``part`` where each run of whitespace matches any whitespace (and, with ``any_numbers``, each
    number any number, one group each)."""
    pieces = []
    for word in re.split(r"(\s+)", part):
        if word.isspace():
            pieces.append(r"\s+")
        elif any_numbers:
            parts = re.split(f"({NUMBER})", word)
            pieces += [f"({NUMBER})" if i % 2 else re.escape(p) for i, p in enumerate(parts) if p]
        else:
            pieces.append(re.escape(word))
    return "".join(pieces)


def _pattern(text: str, value: str) -> re.Pattern[str]:
    """``text`` with ``value`` in its ``{}``, the number in group 2, runs of whitespace matching any whitespace."""
    before, after = text.split("{}", 1)
    return re.compile(f"({_loose(before)})({re.escape(value)})({_loose(after)})")


def _quote(lookup: Any, data: Any, path: str, spec: str) -> str | None:
    """The number at ``path`` formatted as the doc shows it, or None where the result holds none there."""
    try:
        return format(lookup(data, path), spec)
    except (AssertionError, KeyError, IndexError, TypeError):  # lookup asserts a number; None is not one
        return None


Row = tuple[str, str, str, str, str]  # test_doc_numbers' (doc, text, result file, path, format)


def _old_and_new(
    rows: list[Row], lookup: Any, old: dict[str, Any], new: dict[str, Any]
) -> Iterator[tuple[Row, str | None, str | None]]:
    """Each row of a file in ``old`` with the number it quotes from the old copy and from the new file."""
    for row in rows:
        _, _, file, path, spec = row
        if file in old:
            yield row, _quote(lookup, old[file], path, spec), _quote(lookup, new[file], path, spec)


def requote(
    rows: list[Row],
    lookup: Any,
    old: dict[str, Any],
    new: dict[str, Any],
    docs: dict[str, str],
) -> tuple[dict[str, str], list[str]]:
    """The docs with every row's quote of a file in ``old`` moved to ``new``'s value, and a report line per change.

    Args:
        rows: test_doc_numbers' rows.
        lookup: its ``lookup(data, path)``.
        old: result file name -> its old JSON.
        new: result file name -> its new JSON.
        docs: doc path -> its text (read by the caller).
    """
    out = dict(docs)
    report: list[str] = []
    moved: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for (doc, text, _, path, _), before, after in _old_and_new(rows, lookup, old, new):
        if doc not in out:
            continue
        if after is None or before is None:  # e.g. an arm that no longer reached its target: no time to quote
            report.append(f"NO NUMBER {doc}: {text!r}: {path} was {before}, is now {after}: rewrite it by hand")
            continue
        if before == after:
            continue
        body, count = _pattern(text, before).subn(lambda m, v=after: m.group(1) + v + m.group(3), out[doc])
        if count:
            out[doc] = body
            report.append(f"{doc}: {text!r}: {before} -> {after}")
            moved[doc][before].add(after)
        elif _pattern(text, after).search(out[doc]) is None:
            report.append(f"NOT FOUND {doc}: {text!r} (old {before}, new {after})")
    for doc, values in moved.items():
        pairs = ", ".join(f"{b} -> {'/'.join(sorted(a))}" for b, a in values.items())
        report.append(f"{doc} literals to look for: {pairs}")
    return out, report


def retext(text: str, value: str, doc: str, moved: dict[str, set[str]]) -> str | None:
    """``text`` (a row's, ``{}`` for its number) with its literal numbers as ``doc`` now has them around ``value``.

    ``doc`` is squashed (whitespace runs as single spaces); ``moved``: each number a re-measure moved (as the docs
    write it) -> what it became. A literal keeps its number or takes one it moved to, so a short text (a table
    cell and its neighbour) cannot latch onto another table whose numbers happen to fit. None where no place or
    more than one place in the doc reads so.
    """
    before, after = text.split("{}", 1)
    literals = re.findall(NUMBER, before) + re.findall(NUMBER, after)
    pattern = _loose(before, any_numbers=True) + re.escape(value) + _loose(after, any_numbers=True)
    found = {
        m.groups()
        for m in re.finditer(pattern, doc)
        if all(new == old or new in moved.get(old, ()) for old, new in zip(literals, m.groups(), strict=True))
    }
    if len(found) != 1:
        return None
    numbers = list(found.pop())
    return re.sub(NUMBER, lambda _: numbers.pop(0), before) + "{}" + re.sub(NUMBER, lambda _: numbers.pop(0), after)


def mend_rows(
    rows: list[Row],
    lookup: Any,
    squash: Any,
    results: tuple[dict[str, Any], dict[str, Any]],
    *,
    docs: dict[str, str],
    source: str,
) -> tuple[str, list[str]]:
    """``source`` (test_doc_numbers.py) with each stale row text of ``docs`` rewritten by :func:`retext`.

    ``results``: the old and the new JSON by file name; every row's number from one to the other is a move a
    literal may make. A row text is found in the source as its double-quoted literal; one split over several
    literals, or written twice, is reported instead of changed, as is a row whose doc reads no way like it
    and one whose new text another row already has.
    """
    quoted = list(_old_and_new(rows, lookup, *results))
    moved: dict[str, set[str]] = defaultdict(set)
    for _, before, after in quoted:
        if before is not None and after is not None and before != after:
            moved[before].add(after)
    report = []
    squashed = {doc: squash(body) for doc, body in docs.items()}
    for (doc, text, file, path, _), _, value in quoted:
        if doc not in docs:
            continue
        if value is None or squash(text.replace("{}", value)) in squashed[doc]:
            continue
        new = retext(text, value, squashed[doc], moved)
        literal = json.dumps(text)
        if new is None or source.count(literal) != 1 or json.dumps(new) in source:  # not two rows of one text
            report.append(f"ROW BY HAND {doc}: {text!r} ({file}: {path} = {value})")
            continue
        source = source.replace(literal, json.dumps(new))
        report.append(f"row {doc}: {text!r} -> {new!r}")
    return source, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", metavar="NEW=OLD", help="a result file's name and its old copy's path")
    ap.add_argument("--dry-run", action="store_true", help="report, change nothing")
    ap.add_argument("--rows", action="store_true", help="then rewrite the rows whose literal numbers moved")
    opts = ap.parse_args(argv)
    pairs = {}
    for pair in opts.pairs:
        name, sep, old_path = pair.partition("=")
        if not sep or not (RESULTS / name).is_file() or not Path(old_path).is_file():
            print(
                f"requote: {pair!r} is not NAME=OLD_PATH with benchmarks/results/NAME and OLD_PATH files",
                file=sys.stderr,
            )
            return 2
        pairs[name] = Path(old_path)
    sys.path.insert(0, str(ROOT / "tests"))
    import test_doc_numbers as quoted  # the rows, and how they read a number

    old = {name: json.loads(path.read_text()) for name, path in pairs.items()}
    new = {name: json.loads((RESULTS / name).read_text()) for name in pairs}
    names = {doc for doc, _, file, _, _ in quoted.ROWS if file in pairs}
    docs = {doc: (ROOT / doc).read_text() for doc in sorted(names)}
    out, report = requote(quoted.ROWS, quoted.lookup, old, new, docs)
    print("\n".join(report) or "nothing to move")
    if not opts.dry_run:
        for doc, body in out.items():
            if body != docs[doc]:
                (ROOT / doc).write_text(body)
    if opts.rows:
        rows_file = ROOT / "tests" / "test_doc_numbers.py"
        rows = [row for row in quoted.ROWS if row[2] in pairs]
        source, mended = mend_rows(
            rows, quoted.lookup, quoted._squash, (old, new), docs=out, source=rows_file.read_text()
        )
        print("\n".join(mended) or "every row matches its doc")
        if not opts.dry_run:
            rows_file.write_text(source)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
