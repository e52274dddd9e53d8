"""benchmarks/gpu/device_call.sh, one device call of a re-measure, run here against a stand-in headline.sh."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"

#: headline.sh's stand-in: writes the JSON a part would write, and hangs in ``single`` (a part that runs too long).
STAND_IN = """#!/usr/bin/env bash
out=$1 what=$2
if [[ $what == tta ]]; then name="time_to_accuracy_${3%%:*}_seeds${3##*:}"; else name=$what; fi
echo '{}' > "$out/$name.json"
echo "$what ${3:-} done after 1 s"
[[ $what == single ]] && sleep 60
exit 0
"""


NEEDS_SHELL = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout"
)


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    """device_call.sh beside the stand-in headline.sh, and an empty $OUT."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    shutil.copy(ROOT / "benchmarks" / "gpu" / "device_call.sh", gpu)
    (gpu / "headline.sh").write_text(STAND_IN)
    (gpu / "headline.sh").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    return gpu, out


@NEEDS_SHELL
def test_a_call_cut_short_returns_the_parts_it_finished(tmp_path: Path) -> None:
    gpu, out = _stand_in(tmp_path)
    # hf and a seed end, single is still running when the call's limit stops it; the seed after it never starts
    done = subprocess.run(
        ["timeout", "5", "bash", str(gpu / "device_call.sh"), COMMIT, "hf", "bbc:0", "single", "digits:1"],
        env={"OUT": str(out), "REMEASURE_WORK": str(tmp_path / "work"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 124  # stopped by its limit
    assert sorted(p.name for p in out.glob("*.json")) == ["hf.json", "time_to_accuracy_bbc_seeds0.json"]
    assert len(list(out.glob("device_call_*.log"))) == 1


@NEEDS_SHELL
@pytest.mark.parametrize("commit", ["07853b1", "07853b1a", COMMIT.upper(), COMMIT + "0", "HEAD"])
def test_a_commit_that_is_not_a_full_hash_is_refused_before_any_part_runs(tmp_path: Path, commit: str) -> None:
    gpu, out = _stand_in(tmp_path)
    done = subprocess.run(
        ["bash", str(gpu / "device_call.sh"), commit, "hf"],
        env={"OUT": str(out), "REMEASURE_WORK": str(tmp_path / "work"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"device_call.sh: COMMIT must be the full 40-hex hash (git rev-parse HEAD), got '{commit}'"
    )
    assert not list(out.iterdir()) and not (tmp_path / "work").exists()  # nothing ran, nothing was written


def _repo_with_headline(tmp_path: Path) -> Path:
    """A git repository holding headline.sh and one committed file under src/."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "gpu").mkdir(parents=True)
    (repo / "src").mkdir()
    shutil.copy(ROOT / "benchmarks" / "gpu" / "headline.sh", repo / "benchmarks" / "gpu")
    (repo / "src" / "mod.py").write_text("x = 1\n")

    def git(*args: str) -> None:
        identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "-C", str(repo), *identity, *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    return repo


@NEEDS_SHELL
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("change", ["edited", "untracked"])
def test_the_check_before_a_re_measure_refuses_src_changes_not_committed(tmp_path: Path, change: str) -> None:
    # a re-measure names HEAD: measured on a src/ with changes left out of it, its results would name the wrong code
    repo = _repo_with_headline(tmp_path)
    if change == "edited":
        (repo / "src" / "mod.py").write_text("x = 2\n")
    else:
        (repo / "src" / "new.py").write_text("y = 1\n")
    done = subprocess.run(
        ["bash", str(repo / "benchmarks" / "gpu" / "headline.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "headline.sh --check: src/ has changes not committed; commit them first (the results name HEAD)"
    ]


#: run_time_to_accuracy.sh's stand-in: writes the JSON a job would write (OUT TASK SEEDS), holding its arms and flags.
TTA_STAND_IN = """#!/usr/bin/env bash
echo "{\\"arms\\": \\"$ARMS\\", \\"extra\\": \\"$EXTRA\\"}" > "$1/time_to_accuracy_$2_seeds${3//,/}.json"
"""


@NEEDS_SHELL
def test_the_digits_bisect_runs_the_eager_loop_and_elastic_none_with_graphs_then_compilation_off(
    tmp_path: Path,
) -> None:
    gpu = tmp_path / "benchmarks" / "gpu"
    gpu.mkdir(parents=True)
    for name in ("headline.sh", "device_site.sh"):
        shutil.copy(ROOT / "benchmarks" / "gpu" / name, gpu)
    (gpu / "run_time_to_accuracy.sh").write_text(TTA_STAND_IN)
    (gpu / "run_time_to_accuracy.sh").chmod(0o755)
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(gpu / "headline.sh"), str(out), "bisect-digits"],
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert results == {
        "bisect_digits_graphs_off.json": {"arms": "eager,elastic-none", "extra": "--elastic-graphs off"},
        "bisect_digits_compile_off.json": {"arms": "eager,elastic-none", "extra": "--elastic-compile off"},
    }
    assert "(b) with the trainer's compile off done after" in done.stdout
