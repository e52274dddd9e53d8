"""The README's tour: its ``elastic-pipe plan`` example shows a reshape, and the line under it says what it prints."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest

from elastic_pipe.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _plan_example() -> tuple[list[str], str]:
    """The tour's ``elastic-pipe plan --model ...`` command and the comment line under it."""
    match = re.search(r"^elastic-pipe (plan --model [^\n#]+)\n#\s+-> ([^\n]+)$", README.read_text("utf-8"), re.M)
    assert match, "the README's tour should show 'elastic-pipe plan --model ...' with a '#   -> ...' line under it"
    return shlex.split(match.group(1)), match.group(2)


def test_the_tours_plan_compresses_and_beats_freeze_only(capsys: pytest.CaptureFixture[str]) -> None:
    args, said = _plan_example()
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    layouts = [(e["epoch"], e["pipe_len"], e["replicas"]) for e in plan["epochs"]]
    changes = [layouts[0]] + [b for a, b in itertools.pairwise(layouts) if a[1:] != b[1:]]
    assert len(changes) == plan["reshapes"] + 1 >= 3  # the pipeline compresses at least twice
    assert [k for _, k, _ in changes] == sorted((k for _, k, _ in changes), reverse=True)
    assert plan["speedup_over_freeze_only"] > 1.0
    first, *later = changes
    expected = f"K={first[1]} x {first[2]}, then " + ", ".join(f"K={k} x {r} at epoch {e}" for e, k, r in later)
    expected += f": {plan['reshapes']} reshapes, {plan['speedup_over_freeze_only']:.2f}x over freeze-only"
    assert said == expected
