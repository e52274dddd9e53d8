"""Checkpoint files: manifests, checksums, value checks, fallback to an intact checkpoint, atomic writes, pruning.

Each corruption is made on disk the way it happens (a flipped byte, a truncated file, a file swapped under its
manifest, a pointer leading out of the directory) or, for the value checks, saved with consistent checksums so
that only the value check can catch it.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import stat
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from elastic_pipe.orchestrator import ConfigError
from elastic_pipe.orchestrator.persist.files import (
    FORMAT,
    LATEST,
    CorruptCheckpoint,
    checkpoint_files,
    manifest_path,
    prune,
    read_latest,
    write_checkpoint,
)
from elastic_pipe.orchestrator.persist.integrity import MAX_ABS, tensor_checksums, value_problems
from elastic_pipe.orchestrator.persist.loads import load_latest, load_verified
from script_module import load_script


def _state(scale: float = 1.0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(4, 3, generator=g) * scale, "b": torch.zeros(3, dtype=torch.float64)},
        "optimizer": {"state": {"w": {"exp_avg": torch.ones(4, 3), "step": torch.tensor(5.0)}}, "param_groups": []},
        "rng": torch.get_rng_state(),
        "run": {"epoch": 1, "layout": [1, 2]},
    }


def _save(directory: Path, name: str, state: dict[str, Any]) -> Path:
    return write_checkpoint(directory, name, state, {"epoch": 1, "step": 2, "fingerprint": {}})


def _two(directory: Path) -> tuple[Path, Path]:
    """An older intact checkpoint and a newer one that latest.json points at."""
    old = _save(directory, "epoch-0001.pt", _state(1.0))
    new = _save(directory, "epoch-0001-step-000002.pt", _state(2.0))
    return old, new


def _loaded_file(directory: Path, **kwargs: Any) -> str:
    found = load_latest(directory, **kwargs)
    assert found is not None
    return str(found[1]["file"])


def test_a_checkpoint_round_trips_with_its_manifest(tmp_path: Path) -> None:
    state = _state()
    path = _save(tmp_path, "epoch-0001.pt", state)
    manifest = json.loads(manifest_path(path).read_text())
    assert manifest["file"] == "epoch-0001.pt" and manifest["format"] == FORMAT and len(manifest["sha256"]) == 64
    assert set(manifest["tensors"]) == {
        "model/w",
        "model/b",
        "optimizer/state/w/exp_avg",
        "optimizer/state/w/step",
        "rng",
    }
    assert json.loads((tmp_path / LATEST).read_text()) == {
        "format": FORMAT,
        "file": "epoch-0001.pt",
        "epoch": 1,
        "step": 2,
        "fingerprint": {},
    }
    found = load_latest(tmp_path)
    assert found is not None
    loaded, _ = found
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["run"] == state["run"]


@pytest.mark.parametrize("damage", ["flip-byte", "truncate", "empty", "missing-manifest", "swapped-file"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = _two(tmp_path)
    raw = new.read_bytes()
    if damage == "flip-byte":
        new.write_bytes(raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0x01]) + raw[len(raw) // 2 + 1 :])
    elif damage == "truncate":
        new.write_bytes(raw[: len(raw) - 100])
    elif damage == "empty":
        new.write_bytes(b"")
    elif damage == "missing-manifest":
        manifest_path(new).unlink()
    else:  # an intact file of another save under this manifest, its SHA-256 updated: the tensors' CRCs differ
        new.write_bytes(old.read_bytes())
        manifest = json.loads(manifest_path(new).read_text())
        manifest["sha256"] = json.loads(manifest_path(old).read_text())["sha256"]
        manifest_path(new).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="elastic_pipe.orchestrator.persist.loads"):
        assert _loaded_file(tmp_path) == "epoch-0001.pt"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(new) in warnings[0]
    with pytest.raises(CorruptCheckpoint, match=str(new)):
        load_verified(new)


def test_no_intact_checkpoint_is_an_error_naming_every_file(tmp_path: Path) -> None:
    old, new = _two(tmp_path)
    for p in (old, new):
        p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(ConfigError, match="no intact checkpoint") as exc:
        load_latest(tmp_path, warn=False)
    assert str(old) in str(exc.value) and str(new) in str(exc.value)


@pytest.mark.parametrize(
    ("poison", "message"),
    [
        (float("nan"), "non-finite"),
        (float("inf"), "non-finite"),
        (-2.99e36, "magnitude"),  # what one flipped exponent bit makes of a float32 weight
    ],
)
@pytest.mark.parametrize("where", ["model", "optimizer"])
def test_non_finite_or_huge_values_are_refused_even_with_consistent_checksums(
    poison: float, message: str, where: str, tmp_path: Path
) -> None:
    bad = _state()
    if where == "model":
        bad["model"]["w"][1, 2] = poison
    else:
        bad["optimizer"]["state"]["w"]["exp_avg"][0, 0] = poison
    path = _save(tmp_path, "epoch-0002.pt", bad)  # checksums computed over the poisoned state: they all match
    with pytest.raises(CorruptCheckpoint, match=message):
        load_verified(path)
    with pytest.raises(ConfigError, match="no intact checkpoint"):
        load_latest(tmp_path, warn=False)
    loaded, _ = load_verified(path, allow_nonfinite=True)  # the documented opt-out
    torch.testing.assert_close(loaded["model"]["w"], bad["model"]["w"], rtol=0, atol=0, equal_nan=True)
    # with an intact older one, the poisoned latest is skipped
    _save(tmp_path, "epoch-0001.pt", _state())
    (tmp_path / LATEST).write_text(json.dumps({"format": FORMAT, "file": "epoch-0002.pt"}))
    assert _loaded_file(tmp_path, warn=False) == "epoch-0001.pt"


def test_a_real_exponent_bit_flip_is_caught_by_the_value_check() -> None:
    w = torch.tensor([0.0123, -0.7], dtype=torch.float32)
    (bits,) = struct.unpack("<I", struct.pack("<f", float(w[1])))
    (flipped,) = struct.unpack("<f", struct.pack("<I", bits ^ (1 << 30)))  # the exponent's top bit
    w[1] = flipped
    assert abs(flipped) > MAX_ABS
    assert value_problems({"w": w}) == [f"tensor 'w' holds a value of magnitude {abs(flipped):.3g} > {MAX_ABS:g}"]
    assert value_problems({"w": torch.tensor([1e29]), "i": torch.tensor([2**40]), "e": torch.zeros(0)}) == []


def test_tensor_checksums_see_every_byte() -> None:
    a = {"x": torch.arange(6, dtype=torch.float64).reshape(2, 3), "n": [torch.tensor(True)]}
    b = {"x": a["x"].clone(), "n": [torch.tensor(True)]}
    assert tensor_checksums(a) == tensor_checksums(b)
    b["x"][1, 1] = torch.nextafter(b["x"][1, 1], torch.tensor(10.0, dtype=torch.float64))
    assert tensor_checksums(a)["x"] != tensor_checksums(b)["x"] and set(tensor_checksums(a)) == {"x", "n/0"}
    assert tensor_checksums({"t": a["x"].t()}) == tensor_checksums({"t": a["x"].t().contiguous()})


@pytest.mark.parametrize("name", ["../epoch-0001.pt", "/etc/passwd", "sub/epoch-0001.pt", "..", "", 3, None])
def test_latest_json_may_only_point_inside_the_directory(name: object, tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    _save(tmp_path, "epoch-0001.pt", _state())  # a valid checkpoint one level up, where "../" would lead
    (directory / "sub").mkdir(parents=True)
    _save(directory / "sub", "epoch-0001.pt", _state())
    (directory / LATEST).write_text(json.dumps({"format": FORMAT, "file": name}))
    with pytest.raises(ConfigError, match="must name a file inside"):
        read_latest(directory)
    with pytest.raises(ConfigError, match="must name a file inside"):
        load_latest(directory)


def test_latest_json_may_not_be_a_link_out_of_the_directory(tmp_path: Path) -> None:
    outside = _save(tmp_path / "elsewhere", "epoch-0001.pt", _state())
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "epoch-0001.pt").symlink_to(outside)
    (directory / LATEST).write_text(json.dumps({"format": FORMAT, "file": "epoch-0001.pt"}))
    with pytest.raises(ConfigError, match="must name a file inside"):
        read_latest(directory)


def test_a_save_removes_leftover_tmp_files_and_leaves_others(tmp_path: Path) -> None:
    for name in ("epoch-0003.pt.tmp", "epoch-0003.manifest.json.tmp", "latest.json.tmp"):
        (tmp_path / name).write_bytes(b"half a checkpoint")
    (tmp_path / "notes.tmp").write_text("not ours")
    _save(tmp_path, "epoch-0001.pt", _state())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch-0001.manifest.json",
        "epoch-0001.pt",
        "latest.json",
        "notes.tmp",
    ]


def test_every_file_is_fsynced_before_its_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(f"rename {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _save(tmp_path, "epoch-0001.pt", _state())
    names = ["epoch-0001.pt", "epoch-0001.manifest.json", LATEST]
    assert events == [e for n in names for e in ("fsync-file", f"rename {n}", "fsync-dir")]


NAMES = ["epoch-0001.pt", "epoch-0001-step-000002.pt", "epoch-0001-step-000004.pt", "epoch-0002.pt", "epoch-0010.pt"]


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        (0, NAMES),
        (1, ["epoch-0002.pt", "epoch-0010.pt"]),
        (2, ["epoch-0001-step-000004.pt", "epoch-0002.pt", "epoch-0010.pt"]),
        (9, NAMES),
    ],
)
def test_keep_last_prunes_the_oldest_checkpoints(keep: int, kept: list[str], tmp_path: Path) -> None:
    for name in NAMES:
        _save(tmp_path, name, _state())
    assert [p.name for p in checkpoint_files(tmp_path)] == NAMES  # numeric order: step checkpoints inside epochs
    # The newest save is epoch-0002; epoch-0010 comes after it (left by an attempt that failed later) and is kept.
    deleted = prune(tmp_path, keep, tmp_path / "epoch-0002.pt")
    assert [p.name for p in checkpoint_files(tmp_path)] == kept
    assert sorted(p.name for p in deleted) == sorted(set(NAMES) - set(kept))
    assert all(not manifest_path(p).exists() for p in deleted)
    assert all(manifest_path(tmp_path / n).exists() for n in kept)


def test_a_checkpoint_that_kept_decision_due_beside_the_run_is_read_with_it_in_the_run(tmp_path: Path) -> None:
    """Format 3 before decision_due moved into RunState kept it beside ``run``; a load reads it into ``run``, where the
    position part finds it, and leaves a current checkpoint's own flag alone."""
    old = _save(tmp_path, "epoch-0001.pt", {**_state(), "decision_due": True})
    state, _ = load_verified(old)
    assert state["run"] == {"epoch": 1, "layout": [1, 2], "decision_due": True} and "decision_due" not in state
    current = {**_state(), "run": {"epoch": 1, "decision_due": False}, "decision_due": True}
    state, _ = load_verified(_save(tmp_path, "epoch-0002.pt", current))
    assert state["run"]["decision_due"] is False


#: The trainer's modules, which nothing in persist/ may import, at run time or for type checking.
TRAINER = ("elastic_pipe.orchestrator.trainer", "elastic_pipe.orchestrator.trainer_base")


def test_the_checkpointer_never_imports_the_trainer() -> None:
    """No module of persist/ imports the trainer, not even for type checking (every import statement, those under
    ``if TYPE_CHECKING:`` too), nor reaches it through another module at run time; the trainer's old protocol is gone:
    the Checkpointer is built with a map of Stateful parts."""
    import ast

    from elastic_pipe.orchestrator import persist
    from elastic_pipe.orchestrator.persist import checkpoint, parts

    folder = Path(persist.__file__).parent
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        modules |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        names = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
        assert not [m for m in modules if m.startswith(TRAINER)], f"{path.name} imports the trainer"
        assert not names & {"ElasticTrainer", "TrainerBase", "trainer", "trainer_base"}, path.name
    graph = load_script(Path("benchmarks/import_graph.py"))
    arrows = graph.graph(Path(persist.__file__).parents[2])
    reached, todo = set(), [m for m in arrows if m.startswith("elastic_pipe.orchestrator.persist")]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo.extend(arrows.get(m, ()))
    assert "elastic_pipe.orchestrator.persist.checkpoint" in reached and not [
        m for m in reached if m.startswith(TRAINER)
    ]
    assert not hasattr(checkpoint, "Checkpointable")
    assert list(inspect.signature(checkpoint.Checkpointer).parameters)[:3] == ["config", "ctx", "parts"]
    assert {"state_dict", "load_state_dict"} <= set(dir(parts.Stateful))


class _Counter:
    """A toy part: plain data."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.loaded: list[object] = []

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loaded.append(state)
        self.value = state["value"]


def test_a_checkpointer_over_toy_parts_saves_and_restores_each_by_name(one_rank_here: None, tmp_path: Path) -> None:
    """A Checkpointer built over a map of toy Stateful parts (no weights) writes each part's state under its name and
    restores each part from its own entry, in the map's order; a part the checkpoint lacks is refused by name unless
    given a default, and a default for no part, or a part named as one of the files' own entries, is an error."""
    import tiny_vit
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split
    from elastic_pipe.orchestrator.persist import Checkpointer, Part

    tables = {
        "model": tiny_vit.model_table(),
        "train": {"epochs": 1, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
        "freeze": {"policy": "never", "options": {}},
        "pipeline": {"pipe_len": 1, "microbatches": 1, "cache": "off"},
        "launch": {"nproc_per_node": 1},
        "log": {"progress": False},
    }
    config = config_from_tables({**tables, "checkpoint": {"dir": str(tmp_path)}})
    d = load_digits()
    order: list[str] = []
    with ElasticTrainer(config, data=Split(d.inputs[:64], d.labels[:64], d.sample_ids[:64]), quiet=True) as trainer:
        trainer.start()
        counter, weights = _Counter(3), {"w": torch.arange(4.0)}
        notes = ["kept"]

        def load_weights(state: dict[str, torch.Tensor]) -> None:
            order.append("weights")
            weights.update(state)

        def load_notes(state: list[str]) -> None:
            order.append("notes")
            notes[:] = state

        toys = {
            "weights": Part(lambda: {k: v.clone() for k, v in weights.items()}, load_weights),
            "counter": counter,
            "notes": Part(lambda: list(notes), load_notes),
        }
        # the trainer's own map: the names its checkpoints have always kept, in the main file's order
        assert list(trainer.checkpoint_parts()) == [
            "run", "rng", "model", "optimizer", "inference", "scheduler", "policy", "sampler", "history", "epoch_losses"
        ]  # fmt: skip
        assert trainer.checkpointer is not None and trainer.checkpointer.defaults == {
            "epoch_losses": (),
            "inference": None,
        }
        checkpointer = Checkpointer(config, trainer.ctx, toys)
        path = checkpointer.save(trainer.state)
        saved = torch.load(path, weights_only=True)
        assert list(saved) == ["weights", "counter", "notes", "shards", "keys", "format"]  # each under its name
        assert saved["counter"] == {"value": 3} and saved["notes"] == ["kept"]
        assert torch.equal(saved["weights"]["w"], torch.arange(4.0))
        assert torch.load(tmp_path / "epoch-0000.stage-0000.shard", weights_only=True) == {}  # no sharded part

        counter.value, weights["w"], notes[:] = 9, torch.zeros(4), ["changed"]
        found = checkpointer.find()
        assert found is not None and found.path == path
        checkpointer.load(found)
        assert order == ["weights", "notes"] and counter.loaded == [{"value": 3}]  # each its own entry, in order
        assert counter.value == 3 and notes == ["kept"] and torch.equal(weights["w"], torch.arange(4.0))

        # a part the checkpoint lacks: refused by name (no older checkpoint to fall back to), unless given a default
        extra = _Counter(0)
        named = (
            r"epoch-0000.pt: the checkpoint holds no part \['extra'\] \(it holds \[.*'counter', .*'notes', .*'weights'"
        )
        with pytest.raises(ConfigError, match=named):
            Checkpointer(config, trainer.ctx, {**toys, "extra": extra}).find()
        later = Checkpointer(config, trainer.ctx, {**toys, "extra": extra}, defaults={"extra": {"value": 7}})
        found = later.find()
        assert found is not None
        later.load(found)
        assert extra.loaded == [{"value": 7}] and counter.loaded == [{"value": 3}, {"value": 3}]

        # a default for a part the map does not have, and a part named as one of the main file's own entries
        with pytest.raises(ConfigError, match=r"defaults for unknown checkpoint parts \['extra'\]"):
            Checkpointer(config, trainer.ctx, toys, defaults={"extra": 1})
        with pytest.raises(ConfigError, match=r"checkpoint part names \['shards'\]"):
            Checkpointer(config, trainer.ctx, {**toys, "shards": extra})
