"""benchmarks/gpu/ab_commits.sh, the one-job A/B of several commits, run here with a stand-in python3: each commit's
run gets its own src/ first on PYTHONPATH (the device site after it), time_to_accuracy.py's arguments with AB_TTA,
and the summary reads both kinds of report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: python3's stand-in: records its arguments and PYTHONPATH, and writes the report its --out names (the script's
#: own summary, ``python3 -``, runs on the real interpreter).
STAND_IN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["-"]:
    os.execv(sys.executable, [sys.executable, *args])
with open(os.environ["AB_RECORD"], "a") as f:
    f.write(json.dumps({"args": args, "pythonpath": os.environ["PYTHONPATH"], "cwd": os.getcwd()}) + "\\n")
out = args[args.index("--out") + 1]
phases = [{"cache": 0.5}, {"cache": 0.25}]
run = {"total_seconds": 4.0, "compile_seconds": 1.0, "transition_seconds": 0.75, "curve": [[2.0, 0.9], [3.5, 0.95]],
       "transition_phases": phases, "setup_seconds": 0.5, "setup_phases": {"data_check": 0.125}}
plain = {"total_seconds": 5.0, "curve": [[2.5, 0.9]]}
json.dump({"runs": {"elastic-default": {"1": run}, "eager": {"1": plain}}}, open(out, "w"))
"""

NEEDS_SHELL = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _root(tmp_path: Path, commits: list[str]) -> Path:
    """A tree with ab_commits.sh and each commit prepared under out/ab/<commit>/, and the stand-in python3."""
    gpu = tmp_path / "repo" / "benchmarks" / "gpu"
    gpu.mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu" / "ab_commits.sh", gpu)
    for c in commits:
        (tmp_path / "repo" / "out" / "ab" / c / "src").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STAND_IN.replace("#!/usr/bin/env python3", f"#!{shutil.which('python3')}"))
    (bin_dir / "python3").chmod(0o755)
    return tmp_path / "repo"


@NEEDS_SHELL
def test_tta_rounds_run_each_commit_on_its_own_src_in_alternating_order(tmp_path: Path) -> None:
    repo = _root(tmp_path, ["aaa1111", "bbb2222"])
    out, record = tmp_path / "results", tmp_path / "record.jsonl"
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "AB_RECORD": str(record),
        "AB_TTA": "--task bbc --seeds 1 --arms elastic-default",
        "PYTHONPATH": "/site",
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    done = subprocess.run(
        ["bash", str(repo / "benchmarks" / "gpu" / "ab_commits.sh"), str(out), "2", "aaa1111", "bbb2222"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    trees = [Path(c["cwd"]).name for c in calls]
    assert trees == ["aaa1111", "bbb2222", "bbb2222", "aaa1111"]  # the second round reversed
    for call, tree in zip(calls, trees, strict=True):
        assert call["pythonpath"] == f"{repo}/out/ab/{tree}/src:/site"  # its own src first, the site kept
        assert call["args"][:7] == [
            "benchmarks/time_to_accuracy.py",
            "--task",
            "bbc",
            "--seeds",
            "1",
            "--arms",
            "elastic-default",
        ]
        assert call["args"][call["args"].index("--out") + 1].startswith(str(out / f"ab_{tree}_r"))
    summary = json.loads((out / "ab_summary.json").read_text())
    assert sorted(summary) == [f"ab_{c}_r{r} elastic-default seed 1" for c in ("aaa1111", "bbb2222") for r in (1, 2)]
    row = summary["ab_aaa1111_r1 elastic-default seed 1"]  # the plain arm has no transitions: not a row
    assert row == {
        "total_s": 4.0,
        "setup_s": 0.5,
        "setup_phases_s": {"data_check": 0.125},
        "compile_s": 1.0,
        "transitions_s": 0.75,
        "epochs_s": [2.0, 1.5],
        "cache_phases_s": [0.5, 0.25],
    }
    assert "cache_phases_s [0.5, 0.25]" in done.stdout and "setup_phases_s {data_check 0.125}" in done.stdout


NEEDS_TOOLS = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("bash", "git", "xz", "tar")), reason="needs bash, git, xz and tar"
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@NEEDS_TOOLS
def test_prepared_commits_travel_packed_and_are_unpacked_before_the_first_round(tmp_path: Path) -> None:
    repo = _root(tmp_path, [])
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    commits = []
    for version in ("old", "new"):
        (repo / "src").mkdir(exist_ok=True)
        (repo / "src" / "which.py").write_text(f"TREE = {version!r}\n")
        (repo / "benchmarks" / "results").mkdir(exist_ok=True)
        (repo / "benchmarks" / "results" / "big.json").write_text("{}")  # results stay behind
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", version)
        commits.append(_git(repo, "rev-parse", "--short", "HEAD"))
    script = repo / "benchmarks" / "gpu" / "ab_commits.sh"
    prepared = subprocess.run(["bash", str(script), "--prepare", *commits], capture_output=True, text=True, check=False)
    assert prepared.returncode == 0, prepared.stderr
    ab = repo / "out" / "ab"
    assert sorted(p.name for p in ab.iterdir()) == sorted(f"{c}.tar.xz" for c in commits)  # packed, not unpacked
    record = tmp_path / "record.jsonl"
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "AB_RECORD": str(record),
        "AB_TTA": "--task bbc --seeds 1",
        "PYTHONPATH": "/site",
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    done = subprocess.run(
        ["bash", str(script), str(tmp_path / "results"), "1", *commits],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for commit, version in zip(commits, ("old", "new"), strict=True):
        assert (ab / commit / "src" / "which.py").read_text() == f"TREE = {version!r}\n"  # each commit's own tree
        assert (ab / commit / "benchmarks" / "gpu" / "ab_commits.sh").exists()
        assert not (ab / commit / "benchmarks" / "results").exists()
    assert [Path(json.loads(line)["cwd"]).name for line in record.read_text().splitlines()] == commits
