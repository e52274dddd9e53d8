"""benchmarks/gpu/device_call.sh, one device call of a re-measure, run here against a stand-in headline.sh."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: headline.sh's stand-in: writes the JSON a part would write, and hangs in ``single`` (a part that runs too long).
STAND_IN = """#!/usr/bin/env bash
out=$1 what=$2
if [[ $what == tta ]]; then name="time_to_accuracy_${3%%:*}_seeds${3##*:}"; else name=$what; fi
echo '{}' > "$out/$name.json"
echo "$what ${3:-} done after 1 s"
[[ $what == single ]] && sleep 60
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_a_call_cut_short_returns_the_parts_it_finished(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    shutil.copy(ROOT / "benchmarks" / "gpu" / "device_call.sh", gpu)
    (gpu / "headline.sh").write_text(STAND_IN)
    (gpu / "headline.sh").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    # hf and a seed end, single is still running when the call's limit stops it; the seed after it never starts
    done = subprocess.run(
        ["timeout", "5", "bash", str(gpu / "device_call.sh"), "abc123", "hf", "bbc:0", "single", "digits:1"],
        env={"OUT": str(out), "REMEASURE_WORK": str(tmp_path / "work"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 124  # stopped by its limit
    assert sorted(p.name for p in out.glob("*.json")) == ["hf.json", "time_to_accuracy_bbc_seeds0.json"]
    assert len(list(out.glob("device_call_*.log"))) == 1
