"""One of each rule (issue #42): a schedule the runtime cannot run is refused before any process starts; one dataset
registry."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe import data as edata
from elastic_pipe import orchestrator
from elastic_pipe import schedule as sched
from elastic_pipe.cli import main
from elastic_pipe.orchestrator import ConfigError, components_from_config, config_from_tables

TINY = {"name": "vit", "options": {"preset": "vit-tiny", "depth": 2, "dim": 16, "heads": 2, "mlp_dim": 32}}
REFUSED = "pipeline.schedule 'interleaved' cannot run here with pipeline.virtual = 1 stage(s) per rank"


def test_components_refuse_a_schedule_the_runtime_cannot_run() -> None:
    config = config_from_tables({"model": TINY, "pipeline": {"schedule": "interleaved"}})  # the config accepts it
    with pytest.raises(ConfigError, match=re.escape(REFUSED)) as info:
        components_from_config(config)
    assert "\n" not in str(info.value) and "chunks" in str(info.value)  # one line, with the generator's reason
    with pytest.raises(ConfigError, match=re.escape(REFUSED)):  # the keyword given instead of the config's name too
        components_from_config(config_from_tables({"model": TINY}), schedule="interleaved")


@pytest.mark.parametrize("name", sorted(set(sched.GENERATORS) - {"interleaved"}))
def test_every_other_registered_schedule_is_accepted(name: str) -> None:
    from elastic_pipe.orchestrator.components import check_runnable_schedule

    check_runnable_schedule(name)
    config = config_from_tables({"model": TINY, "pipeline": {"schedule": name}})
    assert components_from_config(config).schedule == name


def test_train_exits_2_with_one_line_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[Any] = []
    monkeypatch.setattr(orchestrator, "launch", lambda *a, **k: launched.append(a))  # the CLI's launcher
    path = tmp_path / "run.toml"
    path.write_text(
        '[model]\nname = "vit"\noptions = { preset = "vit-tiny", depth = 2, dim = 16, heads = 2, mlp_dim = 32 }\n'
        '[pipeline]\npipe_len = 2\nschedule = "interleaved"\n[launch]\nnproc_per_node = 2\n',
        encoding="utf-8",
    )
    assert main(["train", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("elastic-pipe train: error: ") and REFUSED in captured.err
    assert launched == []


@pytest.mark.parametrize(("name", "virtual"), [("interleaved", 2), ("interleaved", 3), ("gpipe", 2)])
def test_a_schedule_of_several_stages_per_rank_is_accepted_with_virtual(name: str, virtual: int) -> None:
    manual = {"policy": "manual", "options": {"schedule": {}}}
    config = config_from_tables({"model": TINY, "pipeline": {"schedule": name, "virtual": virtual}, "freeze": manual})
    assert components_from_config(config).schedule == name
    # with checkpoints too: each rank writes one shard per stage it holds (tests/test_training_virtual_resume.py)
    kept = config.override({"checkpoint.dir": "/tmp/ckpt"})
    assert components_from_config(kept).schedule == name


@pytest.mark.parametrize(
    ("tables", "reason"),
    [
        ({"pipeline": {"schedule": "1f1b", "virtual": 2}}, "1f1b holds one stage per rank"),
        ({"pipeline": {"schedule": "zb1p", "virtual": 2}}, "ZB-H1) holds one stage per rank"),
        (
            {
                "pipeline": {"schedule": "interleaved", "virtual": 2, "pipe_len": 2, "microbatches": 3},
                "train": {"global_batch": 60},
            },
            "microbatches to be a multiple of ranks=2",
        ),
    ],
)
def test_what_several_stages_per_rank_cannot_run_is_refused_in_one_line(tables: dict[str, Any], reason: str) -> None:
    base: dict[str, Any] = {
        "model": TINY,
        "pipeline": {"schedule": "interleaved", "virtual": 2},
        "freeze": {"policy": "manual", "options": {"schedule": {}}},
    }
    config = config_from_tables({**base, "launch": {"nproc_per_node": 2}, **tables})
    with pytest.raises(ConfigError, match="virtual = 2") as info:
        components_from_config(config)
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_the_config_dataset_names_read_the_one_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.orchestrator import components

    assert all(components.DATASETS[name] is loader for name, loader in edata.DATASETS.items())
    assert set(components.DATASETS) == {*edata.DATASETS, "bbcnews"}  # plus the tokenised text (needs a model)
    monkeypatch.setitem(edata.DATASETS, "digits-again", edata.load_digits)  # registered once, in elastic_pipe.data
    assert components.DATASETS["digits-again"] is edata.load_digits
    config = config_from_tables({"model": TINY, "data": {"dataset": "digits-again"}})
    assert len(components.load_samples(config)) == len(edata.load_digits())
    with pytest.raises(ConfigError, match="unknown dataset 'nope'; expected one of bbcnews, digits, digits-again"):
        components.load_samples(config_from_tables({"model": TINY, "data": {"dataset": "nope"}}))
