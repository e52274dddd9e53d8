"""TensorBoard scalars beside events.jsonl: what the sink writes, read back with TensorBoard's own reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.orchestrator.config import LogSection
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.orchestrator.preflight import preflight
from elastic_pipe.orchestrator.report import EpochMetrics, EventLog, TransitionEvent
from elastic_pipe.orchestrator.report.tensorboard import EPOCH_SCALARS, TensorBoardSink

TINY = {
    "model": {"name": "vit", "options": {"preset": "vit-tiny"}},
    "freeze": {"policy": "alpha", "options": {"alpha": 0.5}},
}
EPOCH = EpochMetrics(
    epoch=3,
    steps=10,
    samples=640,
    dropped=0,
    seconds=2.5,
    samples_per_s=256.0,
    loss=0.75,
    eval_loss=0.5,
    eval_accuracy=None,  # non-classification: no scalar
    data_s=0.01,
    forward_s=0.1,
    backward_s=0.1,
    grad_sync_s=0.02,
    optimizer_s=0.01,
    grad_sync_ops=20,
    grad_sync_ops_per_s=8.0,
    first_step_s=0.4,
    pipe_len=2,
    replicas=2,
    frozen_units=1,
    frozen_sublayers=3,
    microbatches=4,
    cache=False,
    lr=0.125,
)
TRANSITION = TransitionEvent(
    epoch=4,
    step=40,
    frozen_units=2,
    frozen=5,
    pipe_len=1,
    replicas=4,
    microbatches=1,
    boundaries=(5, 14),
    changed_ranks=(1, 2, 3),
    bytes_moved=1_000_000,
    cache=False,
    seconds=0.25,
)


def test_sink_writes_epoch_and_transition_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tensorboard")
    log = EventLog(tmp_path / "events.jsonl", None, [sink])
    try:
        log.record(EPOCH.to_dict())
        log.record(TRANSITION.to_dict())
        log.record({"kind": "something_else", "epoch": 0, "loss": 9.0})
    finally:
        sink.close()
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 3

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    read = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert read == {
        "epoch/loss": [(3, 0.75)],
        "epoch/eval_loss": [(3, 0.5)],
        "epoch/samples_per_s": [(3, 256.0)],
        "epoch/pipe_len": [(3, 2.0)],
        "epoch/replicas": [(3, 2.0)],
        "epoch/frozen_units": [(3, 1.0)],
        "epoch/lr": [(3, 0.125)],
        "epoch/seconds": [(3, 2.5)],
        "transition/seconds": [(4, 0.25)],
        "transition/bytes_moved": [(4, 1_000_000.0)],
    }
    assert set(EPOCH_SCALARS) - {t.split("/")[1] for t in read if t.startswith("epoch/")} == {"eval_accuracy"}


def test_tensorboard_needs_a_log_dir() -> None:
    with pytest.raises(ConfigError, match=r"log\.tensorboard = true needs log\.dir"):
        LogSection(tensorboard=True)
    with pytest.raises(ConfigError, match=r"log\.tensorboard must be true or false"):
        LogSection(dir="logs", tensorboard="yes")  # type: ignore[arg-type]


def test_preflight_names_the_extra_when_tensorboard_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_tables(TINY).override({"log.dir": str(tmp_path), "log.tensorboard": True})
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the import now raises ImportError
    with pytest.raises(ConfigError) as exc:
        preflight(config)
    assert str(exc.value) == (
        "[log] tensorboard = true needs the tensorboard package: pip install 'elastic-pipe[tensorboard]'"
    )
