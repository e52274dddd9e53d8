"""benchmarks/gpu/install_remeasure.py: the bookkeeping after a re-measure's device calls, on stand-in results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from script_module import load_script

NEW = "a" * 40
OLD = "b" * 40


def _tool() -> ModuleType:
    return load_script(Path("benchmarks/gpu/install_remeasure.py"))


def _write(path: Path, commit: str, dirty: bool = False, **extra: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit": commit, "dirty": dirty, **extra}))


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """A device call's returned files (two single results, two seeds of one task, a log) and today's results."""
    returned, results = tmp_path / "returned", tmp_path / "results"
    _write(returned / "headline_single.json", NEW, arm="new")
    _write(returned / "gpu_hf_callback.json", NEW, arm="new hf")
    _write(returned / "time_to_accuracy_bbc_seeds1.json", NEW)
    _write(returned / "time_to_accuracy_bbc_seeds0.json", NEW)
    _write(returned / "compile_alone_lazy.json", NEW)
    _write(returned / "time_to_accuracy_bbc_lora_tuning.json", NEW)
    (returned / "device_call_0101.log").write_text("not a result")
    _write(results / "headline_single.json", OLD, arm="old")
    _write(results / "gpu_1xh100_hf_callback.json", OLD, arm="old hf")
    _write(results / "time_to_accuracy_bbc.json", OLD)
    return returned, results


def test_the_plan_keeps_each_old_result_under_its_commit_and_installs_under_the_quoted_name(
    folders: tuple[Path, Path],
) -> None:
    returned, results = folders
    tool = _tool()
    p = tool.plan(returned, results)
    assert p.commits == (NEW,)
    assert p.install == {
        "headline_single.json": returned / "headline_single.json",
        "gpu_1xh100_hf_callback.json": returned / "gpu_hf_callback.json",
        "compile_alone_lazy.json": returned / "compile_alone_lazy.json",
    }
    assert p.skipped == ("time_to_accuracy_bbc_lora_tuning.json",)  # named in the plan, not silently dropped
    assert p.keep == {
        "headline_single.json": "headline_single_bbbbbbb.json",
        "gpu_1xh100_hf_callback.json": "gpu_1xh100_hf_callback_bbbbbbb.json",
        "time_to_accuracy_bbc.json": "time_to_accuracy_bbc_bbbbbbb.json",
    }
    assert p.merge == {
        "bbc": [returned / "time_to_accuracy_bbc_seeds0.json", returned / "time_to_accuracy_bbc_seeds1.json"]
    }
    tool.apply(p, results)
    assert json.loads((results / "headline_single_bbbbbbb.json").read_text())["arm"] == "old"
    assert json.loads((results / "headline_single.json").read_text())["arm"] == "new"
    assert json.loads((results / "gpu_1xh100_hf_callback.json").read_text())["arm"] == "new hf"
    assert json.loads((results / "gpu_1xh100_hf_callback_bbbbbbb.json").read_text())["arm"] == "old hf"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: _write(r / "time_to_accuracy_bbc_seeds1.json", "c" * 40), "the seeds name 2 commits"),
        (lambda r: _write(r / "gpu_hf_callback.json", NEW, dirty=True), "tree whose src/ differed from aaaaaaa"),
        (lambda r: _write(r / "gpu_hf_callback.json", "abc1234"), "names no full commit"),
    ],
    ids=["seeds of two commits", "dirty", "short commit"],
)
def test_files_of_other_or_unnamed_code_are_refused(folders: tuple[Path, Path], change: object, message: str) -> None:
    returned, results = folders
    tool = _tool()
    change(returned)  # type: ignore[operator]
    with pytest.raises(tool.InstallError, match=message):
        tool.plan(returned, results)


def test_an_old_copy_of_another_content_and_a_second_install_are_refused(folders: tuple[Path, Path]) -> None:
    returned, results = folders
    tool = _tool()
    _write(results / "headline_single_bbbbbbb.json", OLD, arm="something else")
    with pytest.raises(tool.InstallError, match=r"headline_single_bbbbbbb\.json exists and differs"):
        tool.plan(returned, results)
    (results / "headline_single_bbbbbbb.json").unlink()
    tool.apply(tool.plan(returned, results), results)
    with pytest.raises(tool.InstallError, match="already holds aaaaaaa's results"):
        tool.plan(returned, results)


def test_the_command_refuses_a_folder_without_results_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = _tool()
    (tmp_path / "notes.log").write_text("")
    assert tool.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"install_remeasure: {tmp_path} holds no result a re-measure writes"]
    assert tool.main([str(tmp_path / "missing")]) == 2


def test_a_python_without_the_steps_modules_is_refused_before_anything_moves(
    folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    returned, results = folders
    tool = _tool()
    p = tool.plan(returned, results)
    assert tool.missing_modules(p, requote=True) == []  # this suite's environment has them all
    real = tool.importlib.util.find_spec
    monkeypatch.setattr(tool.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    assert tool.missing_modules(p, requote=True) == ["torch"]  # the seeds' merge needs it
    no_seeds = tool.Plan(p.commits, p.install, p.keep, {})
    assert tool.missing_modules(no_seeds, requote=True) == []


def test_a_commit_whose_src_is_not_heads_is_refused() -> None:
    tool = _tool()
    if shutil.which("git") is None or not (tool.ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = tool.subprocess.run(["git", "rev-parse", "HEAD"], cwd=tool.ROOT, capture_output=True, text=True).stdout
    tool.check_src(head.strip())  # today's src/ is HEAD's: no error
    with pytest.raises(tool.InstallError, match="git cannot compare"):
        tool.check_src("f" * 40)
    first = tool.subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"], cwd=tool.ROOT, capture_output=True, text=True
    ).stdout.split()
    if not first:
        pytest.skip("not a git checkout with history")
    with pytest.raises(tool.InstallError, match="src/ changed since"):
        tool.check_src(first[0])  # the first commit's src/ is not today's


def test_results_measured_later_on_the_cpu_may_name_another_commit_and_install_too(folders: tuple[Path, Path]) -> None:
    """The demo and the Lightning jobs run here after the device calls, at a later commit of the same src/: each
    file's commit is checked against HEAD's src/ (``check_src``, in ``main``), and each old copy is named by its own."""
    returned, results = folders
    later = "c" * 40
    _write(returned / "demo_cpu.json", later, arm="new demo")
    _write(results / "demo_cpu.json", OLD, arm="old demo")
    tool = _tool()
    p = tool.plan(returned, results)
    assert p.commits == (NEW, later)
    assert p.install["demo_cpu.json"] == returned / "demo_cpu.json"
    assert p.keep["demo_cpu.json"] == "demo_cpu_bbbbbbb.json"
    _write(results / "demo_cpu.json", later)  # already installed from this commit: a second install is refused
    with pytest.raises(tool.InstallError, match=r"demo_cpu\.json already holds ccccccc's results"):
        tool.plan(returned, results)
