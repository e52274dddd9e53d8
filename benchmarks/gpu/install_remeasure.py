"""Install a re-measure's results: the bookkeeping after the device calls of docs/benchmarks.md, "The headline,
re-measured", in one command instead of a page of hand steps.

    python benchmarks/gpu/install_remeasure.py DIR [--dry-run] [--no-requote]

DIR holds the JSONs the device calls returned (``device_call.sh`` writes them under ``$OUT``; put the calls'
files in one folder). The command

1. checks that every file names a commit, measured on a clean tree, whose ``src/`` is today's (``HEAD``'s):
   anything else would quote numbers of other code (the device's results and the CPU's, measured after them, may
   name different commits of the same ``src/``; the seeds of one time-to-accuracy task share one);
2. keeps each result the docs quote under its old commit (``headline_single.json`` -> ``headline_single_b3c28ee.json``,
   the commit the old file names), refusing to overwrite a different file of that name;
3. installs the new results under the names the docs quote (the device's ``gpu_hf_callback.json`` is
   ``gpu_1xh100_hf_callback.json`` here) and merges the time-to-accuracy seeds of each task into one report and
   its plot (``benchmarks/time_to_accuracy.py --merge``);
4. moves the docs' quoted numbers from the old copies to the new files and mends the rows those moves made stale
   (``benchmarks/requote.py --rows``), redraws the HF callback's plot, and prints the history row
   (``benchmarks/gpu/headline_table.py``) and what is left to do by hand.

It refuses, before moving anything, a Python that lacks a module those steps import.

``--dry-run`` prints the plan and changes nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

#: The name a device part writes -> the name the docs quote.
INSTALLED_AS = {
    "headline_single.json": "headline_single.json",
    "headline_default_policy.json": "headline_default_policy.json",
    "headline_default_policy_digits.json": "headline_default_policy_digits.json",
    "headline_disk_data.json": "headline_disk_data.json",
    "gpu_hf_callback.json": "gpu_1xh100_hf_callback.json",
    "gpu_hf_callback_8epochs.json": "gpu_1xh100_hf_callback_8epochs.json",
    "compile_alone_lazy.json": "compile_alone_lazy.json",
    "compile_alone_first.json": "compile_alone_first.json",
    # measured here, on the CPU (docs/training.md and docs/integrations.md give the commands), after the device calls
    "demo_cpu.json": "demo_cpu.json",
    "lightning_callback_cpu_640docs_8epochs.json": "lightning_callback_cpu_640docs_8epochs.json",
    "lightning_callback_cpu_640docs_8epochs_seeds23.json": "lightning_callback_cpu_640docs_8epochs_seeds23.json",
}
#: One seed's time-to-accuracy report, as ``run_time_to_accuracy.sh`` names it.
TTA_SEED = re.compile(r"time_to_accuracy_(?P<task>[a-z]+)_seeds(?P<seed>\d+)\.json")

#: What no command here re-runs, for the closing checklist.
BY_HAND = (
    'rows whose doc text names the old commit as history ("at <old>"): point them at the kept copies',
    "the prose numbers requote.py lists (ratios, the other side of a comparison, tables pasted whole), then "
    "`python benchmarks/requote.py --rows NAME=OLD_COPY ...` again to mend the rows those edits made stale, and "
    "`python -m pytest -q tests/test_doc_numbers.py` for what is left",
    "the history row of docs/benchmarks.md (printed above) and its table_rows entry in tests/test_doc_numbers.py",
    "the CPU results README quotes (demo_cpu.json, the Lightning jobs), if they were not in the folder: "
    "docs/integrations.md and docs/training.md give their commands (write them into the folder and run this again)",
)
HF_PLOT = ("gpu_1xh100_hf_callback.json", "gpu_1xh100_hf_callback_8epochs.json")  # docs/integrations.md's plot


class InstallError(Exception):
    """The returned files cannot be installed as they are (one line: what and why)."""


@dataclass(frozen=True)
class Plan:
    """What an install does: the commits measured (each with today's ``src/``: the device's results and the CPU's,
    measured later, may name different ones), the results installed, the old copies kept, the seeds merged."""

    commits: tuple[str, ...]
    install: dict[str, Path]  # name the docs quote -> the returned file
    keep: dict[str, str]  # name the docs quote -> the name its old copy gets
    merge: dict[str, list[Path]]  # task -> its seeds' files, in seed order
    skipped: tuple[str, ...] = ()  # JSONs in the folder that no doc quotes (a tuning file, a screen): not installed


def _commit(data: dict[str, object], path: Path) -> str:
    commit = data.get("commit")
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise InstallError(f"{path.name} names no full commit ({commit!r})")
    if data.get("dirty") is not False:
        raise InstallError(f"{path.name} was measured on a tree whose src/ differed from {commit[:7]}")
    return commit


def plan(returned: Path, results: Path = RESULTS) -> Plan:
    """The install of the files in ``returned`` into ``results`` (reads only)."""
    install: dict[str, Path] = {}
    merge: dict[str, list[tuple[int, Path]]] = {}
    commits: dict[str, str] = {}  # file -> the commit it names
    skipped: list[str] = []
    for path in sorted(returned.glob("*.json")):
        seed = TTA_SEED.fullmatch(path.name)
        if seed is None and path.name not in INSTALLED_AS:
            skipped.append(path.name)  # a tuning file, a screen: nothing the docs quote, said so below
            continue
        commits[path.name] = _commit(json.loads(path.read_text()), path)
        if seed is not None:
            merge.setdefault(seed["task"], []).append((int(seed["seed"]), path))
        else:
            install[INSTALLED_AS[path.name]] = path
    if not commits:
        raise InstallError(f"{returned} holds no result a re-measure writes")
    seed_commits = {commits[path.name] for files in merge.values() for _, path in files}
    if len(seed_commits) > 1:  # one report merges them: its seeds must share a commit
        raise InstallError(
            f"the seeds name {len(seed_commits)} commits ({', '.join(sorted(c[:7] for c in seed_commits))})"
        )
    named = {name: commits[path.name] for name, path in install.items()}
    named.update({f"time_to_accuracy_{task}.json": commits[files[0][1].name] for task, files in merge.items()})
    keep: dict[str, str] = {}
    for name, commit in named.items():
        old_path = results / name
        if not old_path.exists():
            continue
        old = json.loads(old_path.read_text())
        old_commit = str(old.get("commit", ""))
        if old_commit == commit:
            raise InstallError(f"{name} already holds {commit[:7]}'s results")
        copy = f"{name.removesuffix('.json')}_{old_commit[:7] or 'unstamped'}.json"
        if (results / copy).exists() and (results / copy).read_bytes() != old_path.read_bytes():
            raise InstallError(f"{copy} exists and differs from {name}: move it aside first")
        keep[name] = copy
    seeds = {task: [p for _, p in sorted(files)] for task, files in merge.items()}
    return Plan(tuple(sorted(set(commits.values()))), install, keep, seeds, tuple(skipped))


def check_src(commit: str, root: Path = ROOT) -> None:
    """Refuse a commit whose ``src/`` is not ``HEAD``'s (the docs would quote other code's numbers)."""
    command = ["git", "diff", "--name-only", commit, "HEAD", "--", "src"]
    diff = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if diff.returncode != 0:
        raise InstallError(f"git cannot compare {commit[:7]} with HEAD: {diff.stderr.strip()}")
    if diff.stdout.strip():
        changed = diff.stdout.split()
        raise InstallError(f"src/ changed since {commit[:7]} ({', '.join(changed[:3])}): re-measure at HEAD")


def apply(p: Plan, results: Path = RESULTS) -> None:
    """Keep the old copies, then install the new single results (the merges run in :func:`main`)."""
    for name, copy in p.keep.items():
        (results / copy).write_bytes((results / name).read_bytes())
    for name, path in p.install.items():
        (results / name).write_bytes(path.read_bytes())


def missing_modules(p: Plan, *, requote: bool) -> list[str]:
    """The modules the steps :func:`main` would run for ``p`` import and this Python lacks (checked before anything
    is moved: a step failing halfway leaves old and new results mixed)."""
    needed = set()
    if p.merge:
        needed |= {"torch", "matplotlib"}  # time_to_accuracy.py --merge, and its plot
    if p.keep and requote:
        needed |= {"elastic_pipe", "pytest"}  # requote.py reads the rows of tests/test_doc_numbers.py
    if set(HF_PLOT) & set(p.install):
        needed.add("matplotlib")
    return sorted(name for name in needed if importlib.util.find_spec(name) is None)


def _run(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("returned", type=Path, help="the folder of the JSONs the device calls returned")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    ap.add_argument("--no-requote", action="store_true", help="install only; leave the docs' numbers as they are")
    args = ap.parse_args(argv)
    try:
        if not args.returned.is_dir():
            raise InstallError(f"{args.returned} is not a folder")
        p = plan(args.returned)
        for commit in p.commits:
            check_src(commit)
        if lacking := missing_modules(p, requote=not args.no_requote):  # before anything is moved
            raise InstallError(f"{sys.executable} lacks {', '.join(lacking)}: use the project's venv")
    except InstallError as exc:
        print(f"install_remeasure: {exc}", file=sys.stderr)
        return 2
    print(f"measured at {', '.join(c[:7] for c in p.commits)} (src/ is HEAD's)")
    for name, copy in p.keep.items():
        print(f"  keep {name} as {copy}")
    for name, path in p.install.items():
        print(f"  install {path.name} as {name}")
    for task, files in p.merge.items():
        print(f"  merge {len(files)} seed(s) of {task}: {', '.join(f.name for f in files)}")
    for name in p.skipped:
        print(f"  not installed: {name} (no doc quotes it)")
    if args.dry_run:
        return 0
    apply(p)
    for task, files in p.merge.items():
        out = RESULTS / f"time_to_accuracy_{task}.json"
        plot = ROOT / "docs" / "img" / f"time_to_accuracy_{task}.png"
        _run("benchmarks/time_to_accuracy.py", "--task", task, "--merge", *map(str, files), "--out", str(out),
             "--plot", str(plot))  # fmt: skip
    if p.keep and not args.no_requote:
        _run("benchmarks/requote.py", "--rows", *(f"{name}={RESULTS / copy}" for name, copy in p.keep.items()))
    if set(HF_PLOT) & set(p.install):
        _run("benchmarks/gpu/plot_hf_callback.py", "docs/img/hf_callback.png", *(str(RESULTS / n) for n in HF_PLOT))
    if "headline_single.json" in p.install:  # installed above
        _run("benchmarks/gpu/headline_table.py", str(RESULTS))
    print("left to do by hand:", *(f"  - {item}" for item in BY_HAND), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
