"""``./dev``: its arguments, and what it would run (``--dry-run``: nothing is created or installed)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "dev"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="./dev is a bash script")


def _dev(*args: str, cwd: Path = ROOT, script: Path = DEV, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("ELASTIC_PIPE_GPU", "PYTHON")}
    return subprocess.run(
        [str(script), *args],
        cwd=cwd,
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    """A checkout of just ``dev`` and ``pyproject.toml`` (its ``.venv`` is the copy's own)."""
    shutil.copy2(DEV, tmp_path / "dev")
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path / "dev"


def _commands(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line[2:] for line in result.stderr.splitlines() if line.startswith("+ ")]


def test_dev_is_an_executable_script_with_help() -> None:
    assert os.access(DEV, os.X_OK)
    result = _dev("--help")
    assert result.returncode == 0, result.stderr
    for words in ("./dev demo", "./dev test", "torch==2.13.0", "--gpu", "ELASTIC_PIPE_GPU=1", '-e ".[test]"'):
        assert words in result.stdout, words
    # the README's set-up is these two commands, the test one being CI's
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme[readme.index("## Set up and run") : readme.index("**Main job**")]
    assert "./dev demo" in setup and "./dev test" in setup and "python -m pytest -q" in setup
    assert "--gpu" in setup and "ELASTIC_PIPE_GPU=1" in setup


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {}, "missing command: expected 'demo' or 'test'"),
        (("bench",), {}, "unknown command 'bench'"),
        (("--gpux", "test"), {}, "unknown option '--gpux'"),
        (("test",), {"ELASTIC_PIPE_GPU": "yes"}, "ELASTIC_PIPE_GPU must be 0 or 1, got 'yes'"),
    ],
)
def test_dev_refuses_bad_arguments_in_one_line(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    script = _copy(tmp_path)
    result = _dev(*args, script=script, cwd=tmp_path, **env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / ".venv").exists()  # refused before anything was created


def test_dev_sets_up_a_fresh_checkout_then_runs_the_ci_test_command(tmp_path: Path) -> None:
    script = _copy(tmp_path)
    venv = tmp_path / ".venv"
    result = _dev("--dry-run", "test", "-k", "partition", script=script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    commands = _commands(result)
    assert commands[0].endswith(f"-m venv {venv}")
    assert commands[-3] == f"{venv}/bin/python -m pip install -q torch==2.13.0"
    assert "--index-url https://download.pytorch.org/whl/cpu" in result.stderr  # the CPU build where it can be had
    assert commands[-2] == f"{venv}/bin/python -m pip install -q -e {tmp_path}[test]"
    assert commands[-1] == f"{venv}/bin/python -m pytest -q -k partition"
    assert not venv.exists()
    # the suite runs exactly as CI runs it
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "-m pytest" in line]
    assert ci == ["python -m pytest -q"]
    assert commands[-1].removeprefix(f"{venv}/bin/").startswith(ci[0])

    gpu = _commands(_dev("--dry-run", "--gpu", "demo", "--no-plot", script=script, cwd=tmp_path))
    assert gpu[-3:] == [
        f"{venv}/bin/python -m pip install -q torch==2.13.0",
        f"{venv}/bin/python -m pip install -q -e {tmp_path}[test]",
        f"{venv}/bin/elastic-pipe demo --no-plot",
    ]
    by_env = _commands(_dev("--dry-run", "demo", script=script, cwd=tmp_path, ELASTIC_PIPE_GPU="1"))
    assert by_env == [*gpu[:-1], f"{venv}/bin/elastic-pipe demo"]


def test_dev_reuses_the_environment_until_pyproject_or_the_torch_build_changes(tmp_path: Path) -> None:
    script = _copy(tmp_path)
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".dev-torch").write_text("torch==2.13.0 cpu\n")
    (venv / ".dev-pyproject").write_text(hashlib.sha256((tmp_path / "pyproject.toml").read_bytes()).hexdigest())
    assert _commands(_dev("--dry-run", "test", script=script, cwd=tmp_path)) == [f"{venv}/bin/python -m pytest -q"]

    with (tmp_path / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    assert _commands(_dev("--dry-run", "test", script=script, cwd=tmp_path)) == [
        f"{venv}/bin/python -m pip install -q -e {tmp_path}[test]",
        f"{venv}/bin/python -m pytest -q",
    ]
    gpu = _commands(_dev("--dry-run", "--gpu", "test", script=script, cwd=tmp_path))
    assert f"{venv}/bin/python -m pip install -q torch==2.13.0" in gpu
    assert not any("venv " in c for c in gpu)  # the environment is reused, not made again
