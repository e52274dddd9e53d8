"""Developer sessions: ``nox -s tests lint typecheck demo bench docs``.

Every session installs the CPU build of torch first so that pip never pulls a multi-GB CUDA build.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.default_venv_backend = "venv"

TORCH = "torch==2.13.0"


def _install(session: nox.Session, extras: str) -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite, as CI runs it."""
    _install(session, "test")
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "benchmarks", "examples", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "examples", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package."""
    _install(session, "dev")
    session.run("mypy")


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job: the embedded demo."""
    _install(session, "datasets,plots")
    session.run("elastic-pipe", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """CPU benchmarks; results land in benchmarks/results/ and tables in docs/."""
    _install(session, "test,bench")
    session.run("python", "benchmarks/run_all.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Check that every docs page links resolve and every example imports."""
    _install(session, "test")
    session.run("python", "-m", "pytest", "-q", "tests/test_docs.py", *session.posargs)
