"""``elastic-pipe export`` writes only where a regular file is, and reads ``latest.json`` as training does.

Every existing ``--out`` that is not a regular file (a link to a file, a dangling link, a link to a directory, a
directory, a device node, a socket) is refused with exit 2 and one line, and left as it was; a regular file is
replaced (through a rename, at the mode a plain create gives). A ``latest.json`` whose ``file`` leads out of the
directory (a path, an absolute path, a link) is refused the same way. The last test prints tried/handled.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from elastic_pipe.cli import main

COUNTS: dict[str, list[int]] = {}


def _count(category: str, handled: bool) -> None:
    tried_handled = COUNTS.setdefault(category, [0, 0])
    tried_handled[0] += 1
    tried_handled[1] += int(handled)


def _checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "epoch-0001.pt"
    torch.save({"model": {"w": torch.arange(6.0).reshape(2, 3)}, "run": {"epoch": 1, "step": 4}}, path)
    (directory / "latest.json").write_text(json.dumps({"file": "epoch-0001.pt"}))
    return path


def _link_to_file(tmp: Path, out: Path) -> None:
    (tmp / "victim.txt").write_text("keep me")
    out.symlink_to(tmp / "victim.txt")


def _dangling_link(tmp: Path, out: Path) -> None:
    out.symlink_to(tmp / "nowhere" / "x")


def _link_to_dir(tmp: Path, out: Path) -> None:
    (tmp / "adir").mkdir()
    out.symlink_to(tmp / "adir")


def _directory(tmp: Path, out: Path) -> None:
    out.mkdir()


def _socket(tmp: Path, out: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(out))
    sock.close()


def _device(tmp: Path, out: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null, in the test's directory


BAD_OUT: dict[str, Callable[[Path, Path], None]] = {
    "link to a file": _link_to_file,
    "dangling link": _dangling_link,
    "link to a directory": _link_to_dir,
    "directory": _directory,
    "socket": _socket,
    "device node": _device,
}


def _identity(path: Path) -> tuple[int, int, int, str | None]:
    info = path.lstat()
    return info.st_mode, info.st_ino, info.st_size, os.readlink(path) if path.is_symlink() else None


@pytest.mark.parametrize("kind", list(BAD_OUT))
def test_an_out_that_is_not_a_regular_file_is_refused_and_left_alone(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt)
    out = tmp_path / "model.safetensors"
    BAD_OUT[kind](tmp_path, out)
    before = _identity(out)
    code = main(["export", "--checkpoint", str(ckpt), "--out", str(out)])
    err = capsys.readouterr().err
    handled = (
        code == 2
        and err.count("\n") == 1
        and err.startswith("elastic-pipe export: error: --out ")
        and str(out) in err
        and _identity(out) == before
    )
    if kind == "link to a file":
        handled = handled and (tmp_path / "victim.txt").read_text() == "keep me"
    _count("--out", handled)
    assert handled, (code, err)


def test_a_regular_out_is_replaced_at_a_plain_files_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt)
    out = tmp_path / "model.safetensors"
    out.write_text("an older export")
    umask = os.umask(0o022)
    try:
        assert main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    finally:
        os.umask(umask)
    capsys.readouterr()
    assert stat.S_ISREG(out.lstat().st_mode) and stat.S_IMODE(out.stat().st_mode) == 0o644
    assert torch.equal(load_file(out)["w"], torch.arange(6.0).reshape(2, 3))
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def _point_outside(tmp: Path, ckpt: Path) -> str:
    _checkpoint(tmp / "outside")
    return "../outside/epoch-0001.pt"


def _absolute(tmp: Path, ckpt: Path) -> str:
    return str(_checkpoint(tmp / "outside"))


def _link_out(tmp: Path, ckpt: Path) -> str:
    (ckpt / "epoch-0002.pt").symlink_to(_checkpoint(tmp / "outside"))
    return "epoch-0002.pt"


BAD_LATEST: dict[str, Callable[[Path, Path], str]] = {
    "relative path out": _point_outside,
    "absolute path": _absolute,
    "link out": _link_out,
}


@pytest.mark.parametrize("kind", list(BAD_LATEST))
def test_a_latest_json_leading_out_of_the_directory_is_refused(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt)
    name = BAD_LATEST[kind](tmp_path, ckpt)
    (ckpt / "latest.json").write_text(json.dumps({"file": name}))
    out = tmp_path / "model.safetensors"
    code = main(["export", "--checkpoint", str(ckpt), "--out", str(out)])
    err = capsys.readouterr().err
    handled = code == 2 and err.count("\n") == 1 and "must name a file inside" in err and not out.exists()
    _count("latest.json", handled)
    assert handled, (code, err)


def test_a_directory_without_latest_json_exports_its_newest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt)
    (ckpt / "latest.json").unlink()
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "m.safetensors")]) == 0
    assert str(ckpt / "epoch-0001.pt") in capsys.readouterr().out


def test_zz_counts_per_category(capsys: pytest.CaptureFixture[str]) -> None:
    """Print tried/handled per category (complete when the whole module ran)."""
    with capsys.disabled():
        for category, (tried, handled) in sorted(COUNTS.items()):
            print(f"\nexport {category}: {handled}/{tried} handled")
    assert all(tried == handled for tried, handled in COUNTS.values())
