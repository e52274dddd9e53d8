"""A missing or corrupt ``latest.json`` falls back to the newest intact checkpoint; nothing starts afresh over them.

Each way the index can be lost (deleted, not JSON, not UTF-8, not an object, a ``file`` outside the directory, a
``file`` that is missing) is made on disk beside two intact checkpoints; the newest intact one is loaded, with a
warning, and the loader says which file it was. A lost index with no checkpoint to fall back to is an error
(``resume = 'never'`` starts afresh); with neither, a run starts afresh. Then on two gloo ranks: a run whose
``latest.json`` was deleted and whose newest checkpoint was damaged resumes from the older one, and "resuming from"
names that file.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.orchestrator import ConfigError
from elastic_pipe.orchestrator.persist.files import (
    LATEST,
    CorruptCheckpoint,
    manifest_path,
    shard_digests,
    shard_name,
    write_checkpoint,
    write_shard,
)
from elastic_pipe.orchestrator.persist.loads import find_latest, latest_meta, load_verified
from elastic_pipe.testing import RankContext, run_distributed


def _state(scale: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"model": {"w": torch.randn(4, 3, generator=g) * scale}, "run": {"epoch": 1}}


def _two(directory: Path) -> tuple[Path, Path]:
    fingerprint = {"names": ["w"], "shapes": [[4, 3]]}
    old = write_checkpoint(directory, "epoch-0001.pt", _state(1.0), {"epoch": 1, "step": 8, "fingerprint": fingerprint})
    new = write_checkpoint(
        directory, "epoch-0002.pt", _state(2.0), {"epoch": 2, "step": 16, "fingerprint": fingerprint}
    )
    return old, new


#: How ``latest.json`` gets lost: None deletes it, bytes are written as they are.
LOST_INDEX: dict[str, bytes | None] = {
    "deleted": None,
    "not-json": b"{not json",
    "not-utf8": b'{"file": "epoch-0002.pt\xff\xfe"}',
    "empty": b"",
    "a-list": b"[1, 2, 3]",
    "file-outside": b'{"file": "../../etc/passwd"}',
    "file-absolute": b'{"file": "/etc/passwd"}',
    "file-not-a-string": b'{"file": 7}',
    "file-missing": b'{"format": 4, "file": "epoch-0009.pt"}',
}

#: Tried and handled per category; the last test prints them.
COUNTS: dict[str, list[int]] = {}


def _count(category: str, handled: bool) -> None:
    tried_handled = COUNTS.setdefault(category, [0, 0])
    tried_handled[0] += 1
    tried_handled[1] += int(handled)


def _lose_index(directory: Path, how: str) -> None:
    content = LOST_INDEX[how]
    if content is None:
        (directory / LATEST).unlink()
    else:
        (directory / LATEST).write_bytes(content)


@pytest.mark.parametrize("how", list(LOST_INDEX))
@pytest.mark.parametrize("newest", ["intact", "damaged"])
def test_a_lost_index_falls_back_to_the_newest_intact_checkpoint(
    how: str, newest: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = _two(tmp_path)
    if newest == "damaged":
        new.write_bytes(new.read_bytes()[:-7])
    _lose_index(tmp_path, how)
    with caplog.at_level(logging.WARNING, logger="elastic_pipe.orchestrator.persist.loads"):
        found = find_latest(tmp_path)
    expected = new if newest == "intact" else old
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    handled = (
        found is not None
        and found[2] == expected  # the file actually loaded
        and torch.equal(found[0]["model"]["w"], _state(1.0 if expected == old else 2.0)["model"]["w"])
        and any("falling back" in w or "skipping checkpoint" in w for w in warnings)
    )
    _count(f"latest.json {newest} newest", handled)
    assert handled, (found and found[2], warnings)
    meta = latest_meta(tmp_path)  # what preflight checks the model against: a manifest, with its fingerprint
    assert meta is not None and meta["fingerprint"] == {"names": ["w"], "shapes": [[4, 3]]}


@pytest.mark.parametrize("how", [h for h in LOST_INDEX if h != "deleted"])
def test_a_corrupt_index_with_no_checkpoint_to_fall_back_to_is_an_error(how: str, tmp_path: Path) -> None:
    _lose_index(tmp_path, how)
    if how == "file-missing":  # a readable index naming a file that is gone: no checkpoint is intact
        with pytest.raises(ConfigError, match=r"no intact checkpoint in .*epoch-0009.pt"):
            find_latest(tmp_path)
        return
    with pytest.raises(ConfigError, match=r"no checkpoint file in .* to fall back to \(resume = 'never'"):
        find_latest(tmp_path)
    with pytest.raises(ConfigError, match="to fall back to"):
        latest_meta(tmp_path)


def test_no_index_and_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    assert find_latest(tmp_path) is None and latest_meta(tmp_path) is None


def test_a_non_utf8_or_non_object_manifest_is_a_corrupt_checkpoint_not_a_codec_error(tmp_path: Path) -> None:
    old, new = _two(tmp_path)
    manifest_path(new).write_bytes(b'{"sha256": "\xff"}')
    with pytest.raises(CorruptCheckpoint, match="no readable manifest"):
        load_verified(new)
    manifest_path(old).write_text("[1]")
    with pytest.raises(CorruptCheckpoint, match="not a JSON object"):
        load_verified(old)


def test_resume_dir_accepts_a_directory_whose_index_is_lost(tmp_path: Path) -> None:
    import argparse

    from elastic_pipe.cli.train import add_arguments, overrides_from
    from elastic_pipe.orchestrator.config import ModelSection, TrainConfig

    _two(tmp_path / "ckpt")
    (tmp_path / "ckpt" / LATEST).unlink()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "x.toml", "--resume", str(tmp_path / "ckpt")])
    overrides = overrides_from(args, TrainConfig(model=ModelSection(name="vit")))
    assert overrides == {"checkpoint.dir": str(tmp_path / "ckpt"), "checkpoint.resume": "auto"}


# --- a shard swapped together with its manifest ---------------------------------------------------------------------


def _sharded(directory: Path, name: str, scale: float, *, record: bool = True) -> Path:
    """A sharded checkpoint as a Checkpointer writes it: one shard per stage (2), then the main file."""
    files = [shard_name(name, s) for s in range(2)]
    for s, f in enumerate(files):
        write_shard(directory, f, {"model": {f"w{s}": torch.full((3,), scale + s)}, "optimizer": {"state": {}}})
    table: dict[str, Any] = {"files": files, "index": {"w0": files[0], "w1": files[1]}}
    if record:
        table["sha256"] = shard_digests(directory, files)
    main = {"shards": table, "keys": ["w0", "w1"], "run": {"epoch": int(scale)}, "optimizer": {"param_groups": []}}
    return write_checkpoint(directory, name, main, {"epoch": int(scale), "step": 0, "fingerprint": {}})


@pytest.mark.parametrize("stage", [0, 1])
def test_a_shard_swapped_with_its_manifest_is_refused_and_the_older_checkpoint_loaded(
    stage: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    older = _sharded(tmp_path, "epoch-0002.pt", 2.0)
    newer = _sharded(tmp_path, "epoch-0003.pt", 3.0)
    for suffix in ("", "manifest"):  # epoch 2's shard and its manifest copied over epoch 3's: both consistent
        src = tmp_path / shard_name(older.name, stage)
        dst = tmp_path / shard_name(newer.name, stage)
        if suffix:
            src, dst = manifest_path(src), manifest_path(dst)
        shutil.copyfile(src, dst)
    with pytest.raises(CorruptCheckpoint, match=rf"shard {shard_name(newer.name, stage)} is not the one saved with it"):
        load_verified(newer)
    with caplog.at_level(logging.WARNING, logger="elastic_pipe.orchestrator.persist.loads"):
        found = find_latest(tmp_path)
    assert found is not None and found[2] == older
    assert torch.equal(found[0]["model"]["w0"], torch.full((3,), 2.0))
    assert any("a shard swapped with its manifest" in r.getMessage() for r in caplog.records)
    _count("shard swapped with its manifest", found[2] == older)


def test_a_checkpoint_without_recorded_shard_hashes_still_loads(tmp_path: Path) -> None:
    path = _sharded(tmp_path, "epoch-0001.pt", 1.0, record=False)  # written before the main file recorded them
    state, _ = load_verified(path)
    assert torch.equal(state["model"]["w1"], torch.full((3,), 2.0))


# --- a run on two ranks ---------------------------------------------------------------------------------------------

SAMPLES = 160  # 128 training samples: 4 steps of 32 per epoch


def _tables(epochs: int, ckpt: str) -> dict[str, Any]:
    return {
        "model": tiny_vit.model_table(),
        "train": {"epochs": epochs, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
        "freeze": {"policy": "never", "options": {}},
        "pipeline": {"pipe_len": 2, "microbatches": 2, "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "checkpoint": {"dir": ckpt},
        "log": {"progress": False},
    }


def _resume_after_losing_the_index(ctx: RankContext, ckpt: str) -> list[str]:
    import torch.distributed as dist

    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    data = Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])
    with ElasticTrainer(config_from_tables(_tables(3, ckpt)), data=data, quiet=True) as trainer:
        trainer.fit()
    if ctx.rank == 0:  # the index deleted, the newest checkpoint's main file truncated
        main = torch.load(Path(ckpt) / "epoch-0002.pt", weights_only=True)  # the shards' SHA-256 are recorded
        table = main["shards"]
        assert table["sha256"] == shard_digests(Path(ckpt), table["files"]) and len(table["files"]) == 2
        (Path(ckpt) / LATEST).unlink()
        newest = Path(ckpt) / "epoch-0003.pt"
        newest.write_bytes(newest.read_bytes()[:-10])
    dist.barrier()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), ElasticTrainer(config_from_tables(_tables(4, ckpt)), data=data) as trainer:
        result = trainer.fit().to_dict()
    return [*err.getvalue().splitlines(), f"epochs {[e['epoch'] for e in result['epochs']]}"]


@pytest.mark.distributed
def test_a_run_whose_index_is_lost_resumes_from_the_file_it_names(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    lines = run_distributed(_resume_after_losing_the_index, 2, str(ckpt), timeout=240)[0]
    assert f"resuming from epoch 3 step 8 ({ckpt / 'epoch-0002.pt'})" in lines, lines  # not afresh, not epoch 3's
    assert lines[-1] == "epochs [0, 1, 2, 3]", lines  # the history of the first two epochs, then the last two


# --- checks made inside the workers: every rank checks before the resume decision, the ranks agree -----------------


def _rewrite_main(directory: Path, name: str) -> None:
    """Write ``name``'s main file again, recording its shards' current SHA-256 (a save that was consistent)."""
    main = torch.load(directory / name, weights_only=True)
    main["shards"]["sha256"] = shard_digests(directory, main["shards"]["files"])
    old = json.loads(manifest_path(directory / name).read_text(encoding="utf-8"))
    meta = {k: v for k, v in old.items() if k not in ("format", "file", "sha256", "bytes", "tensors")}
    write_checkpoint(directory, name, main, meta)


def _resave_shard(directory: Path, name: str, value: float) -> None:
    """Stage 1's shard of ``name`` saved again with every weight ``value``, its manifest and the main file's record
    matching: only the value check can refuse it."""
    shard_file = shard_name(name, 1)
    shard = torch.load(directory / shard_file, weights_only=True)
    shard["model"] = {k: torch.full_like(v, value) for k, v in shard["model"].items()}
    write_shard(directory, shard_file, shard)
    _rewrite_main(directory, name)


def _edit_json(path: Path, edit: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _flip_crc(manifest: dict[str, Any]) -> None:
    key = next(iter(manifest["tensors"]))
    manifest["tensors"][key] ^= 1


def _flip_fingerprint(manifest: dict[str, Any]) -> None:
    manifest["fingerprint"]["shapes"][0][0] ^= 1


#: Damage to the newest checkpoint (epoch-0002.pt) that only a check inside the workers sees: stage 1's shard, which
#: rank 1 checks (the other rank finds nothing wrong), or the main manifest; what the warning names.
WORKER_DAMAGE: dict[str, tuple[Any, str]] = {
    "nan values, matching checksums": (lambda d, n: _resave_shard(d, n, math.nan), "non-finite values"),
    "huge values, matching checksums": (lambda d, n: _resave_shard(d, n, 1e35), "magnitude"),
    "flipped CRC in a shard manifest": (
        lambda d, n: _edit_json(manifest_path(d / shard_name(n, 1)), _flip_crc),
        "fails its CRC-32",
    ),
    "a shard manifest whose CRC table is a number": (
        lambda d, n: _edit_json(manifest_path(d / shard_name(n, 1)), lambda m: m.update(tensors=5)),
        "cannot be checked",
    ),
    "non-UTF-8 shard manifest": (
        lambda d, n: manifest_path(d / shard_name(n, 1)).write_bytes(b'{"sha256": "\xff"}'),
        "no readable manifest",
    ),
    "non-UTF-8 main manifest": (lambda d, n: manifest_path(d / n).write_bytes(b'{"file": "\xfe"}'), "manifest"),
    "fingerprint bit flip in the main manifest": (
        lambda d, n: _edit_json(manifest_path(d / n), _flip_fingerprint),
        "another model",
    ),
}


def _find_after_damage(ctx: RankContext, root: str) -> dict[str, Any]:
    import torch.distributed as dist

    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split
    from elastic_pipe.orchestrator.persist import Checkpointer

    d = load_digits()
    data = Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])
    source = Path(root) / "ckpt"
    found: dict[str, Any] = {}
    with ElasticTrainer(config_from_tables(_tables(2, str(source))), data=data, quiet=True) as trainer:
        trainer.fit()
        for i, (kind, (damage, _)) in enumerate(WORKER_DAMAGE.items()):
            copy = Path(root) / f"case{i}"
            if ctx.rank == 0:
                shutil.copytree(source, copy)
                damage(copy, "epoch-0002.pt")
            dist.barrier()
            config = config_from_tables(_tables(2, str(copy)))
            with _warnings("elastic_pipe.orchestrator.persist.checkpoint") as warned:
                try:
                    mine = trainer.checkpointer  # the same parts, over the damaged copy
                    assert mine is not None
                    hit = Checkpointer(config, trainer.ctx, mine.parts, defaults=mine.defaults).find()
                    found[kind] = (hit and hit.path.name, warned)
                except ConfigError as exc:
                    found[kind] = (f"error: {exc}", warned)
        # and the run resumes from the older file, saying so: a NaN shard only rank 1 sees
        if ctx.rank == 0:
            _resave_shard(source, "epoch-0002.pt", math.nan)
        dist.barrier()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), ElasticTrainer(config_from_tables(_tables(3, str(source))), data=data) as t:
        result = t.fit().to_dict()
    found["resumed"] = [*err.getvalue().splitlines(), f"epochs {[e['epoch'] for e in result['epochs']]}"]
    return found


@contextlib.contextmanager
def _warnings(logger: str) -> Any:
    """The warnings ``logger`` emits in the block (a list, filled as they come)."""
    seen: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler, target = _Keep(logging.WARNING), logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield seen
    finally:
        target.removeHandler(handler)


@pytest.mark.distributed
def test_checks_inside_the_workers_fall_back_to_the_older_checkpoint_on_every_rank(tmp_path: Path) -> None:
    ranks = run_distributed(_find_after_damage, 2, str(tmp_path), timeout=300)
    for kind, (_, needle) in WORKER_DAMAGE.items():
        loaded = [r[kind][0] for r in ranks]
        warned = [w for r in ranks for w in r[kind][1]]
        handled = (
            loaded == ["epoch-0001.pt", "epoch-0001.pt"]  # both ranks agree on the older file
            and len(warned) == 1  # one warning, by the rank that refused it, naming the file and the reason
            and "epoch-0002.pt" in warned[0]
            and needle in warned[0]
        )
        _count(f"worker check: {kind}", handled)
        assert handled, (kind, loaded, warned)
    lines = ranks[0]["resumed"]
    assert f"resuming from epoch 2 step 4 ({tmp_path / 'ckpt' / 'epoch-0001.pt'})" in lines, lines
    assert lines[-1] == "epochs [0, 1, 2]", lines  # the older checkpoint's history, then epochs 2 and 3 trained again
    _count("worker check: the run resumes from the older file", True)


def test_preflight_passes_a_newest_checkpoint_whose_fingerprint_flipped_when_an_older_one_fits(tmp_path: Path) -> None:
    from elastic_pipe.orchestrator import config_from_tables, preflight
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.persist import fingerprint

    config = config_from_tables(_tables(2, str(tmp_path)))
    mine = fingerprint(build_model(config))
    for epoch in (1, 2):
        write_checkpoint(
            tmp_path, f"epoch-{epoch:04d}.pt", _state(1.0), {"epoch": epoch, "step": 4, "fingerprint": mine}
        )
    _edit_json(manifest_path(tmp_path / "epoch-0002.pt"), _flip_fingerprint)
    assert preflight(config)["resume"]["epoch"] == 1  # the workers skip the newest (with a warning), not the run
    _edit_json(manifest_path(tmp_path / "epoch-0001.pt"), _flip_fingerprint)
    with pytest.raises(ConfigError, match="another model"):  # no checkpoint there fits the model
        preflight(config)


def test_zz_counts_per_category(capsys: pytest.CaptureFixture[str]) -> None:
    """Print tried/handled per category (complete when the whole module ran)."""
    with capsys.disabled():
        for category, (tried, handled) in sorted(COUNTS.items()):
            print(f"\n{category}: {handled}/{tried} handled")
    assert all(tried == handled for tried, handled in COUNTS.values())
