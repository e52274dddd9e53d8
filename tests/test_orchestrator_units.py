"""Pure parts of the orchestrator: configuration, decisions, transition plans, metrics, checkpoints' fingerprints."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from elastic_pipe.groups import plan_spmd
from elastic_pipe.orchestrator import (
    ConfigError,
    TrainConfig,
    config_from_tables,
    load_config,
    preflight,
)
from elastic_pipe.orchestrator.layout.compression import COMPRESSION_RULES
from elastic_pipe.orchestrator.layout.rule import max_frozen_units, next_layout
from elastic_pipe.orchestrator.layout.start import initial_layout
from elastic_pipe.orchestrator.optim import lr_scheduler
from elastic_pipe.orchestrator.report import EventLog, PhaseClock, RunResult, TransitionEvent, seconds_into
from elastic_pipe.orchestrator.stage.forward_timer import ForwardTimer
from elastic_pipe.orchestrator.stage.grad_sync import grad_buckets
from elastic_pipe.orchestrator.step_loop import _timed_step
from elastic_pipe.orchestrator.trainer import candidate_pipe_lens
from elastic_pipe.orchestrator.transition import changed_ranks
from elastic_pipe.types import Layout

TINY = {
    "model": {"name": "vit", "options": {"preset": "vit-tiny"}},
    "freeze": {"policy": "alpha", "options": {"alpha": 0.5}},
}


def _tiny(overrides: dict[str, object] | None = None) -> TrainConfig:
    return config_from_tables(TINY).override(overrides or {})


# ------------------------------------------------------------------------------------------------- configuration
def test_config_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        """
[model]
name = "vit"
options = { preset = "vit-tiny", depth = 4 }
[train]
epochs = 3
global_batch = 32
[freeze]
policy = "alpha"
options = { alpha = 0.5 }
[pipeline]
pipe_len = 2
[launch]
nproc_per_node = 4
""",
        encoding="utf-8",
    )
    c = load_config(path)
    assert (c.model.name, c.model.options, c.train.epochs, c.train.global_batch) == (
        "vit",
        {"preset": "vit-tiny", "depth": 4},
        3,
        32,
    )
    assert (c.freeze.policy, c.freeze.options, c.pipeline.pipe_len, c.world_size, c.initial_replicas) == (
        "alpha",
        {"alpha": 0.5},
        2,
        4,
        2,
    )
    assert config_from_tables(c.to_dict()) == c
    assert c.override({"train.epochs": 5}).train.epochs == 5
    with pytest.raises(ConfigError, match="unknown key 'epoch'"):
        c.override({"train.epoch": 5})
    with pytest.raises(ConfigError, match="epochs must be an integer >= 1"):
        c.override({"train.epochs": 0})


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"model": {"name": "vit"}, "pipeline": {"pipe_len": 3}, "launch": {"nproc_per_node": 4}}, "not divisible"),
        (
            {"model": {"name": "vit"}, "pipeline": {"pipe_len": 4}, "launch": {"nproc_per_node": 2, "nnodes": 2}},
            "exceeds",
        ),
        ({"model": {"name": "vit"}, "train": {"global_batch": 30}, "launch": {"nproc_per_node": 4}}, "divisible"),
        ({"model": {"name": "vit"}, "train": {"optimizer": "lamb"}}, "optimizer must be one of"),
        ({"model": {"name": "vit"}, "trian": {}}, "unknown table [trian]"),
        ({"model": {"name": "vit"}, "train": {"epoch": 3}}, "unknown key 'epoch'"),
        ({"train": {"epochs": 3}}, "[model] name is required"),
        ({"model": {"name": "vit"}, "train": {"epochs": 0}}, "epochs must be an integer >= 1"),
        ({"model": {"name": "vit"}, "log": {"timing_interval": 0}}, "timing_interval must be an integer >= 1"),
    ],
)
def test_bad_configs_name_the_problem(tables: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_tables(tables)
    assert message in str(exc.value)


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[model\nname = 1", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"freeze.policy": "sometimes"}, "unknown freeze policy 'sometimes'"),
        ({"freeze.policy": "no_such_module_xyz:Policy"}, "cannot import 'no_such_module_xyz'"),
        ({"freeze.policy": "elastic_pipe.freeze:NoSuchPolicy"}, "has no attribute 'NoSuchPolicy'"),
        ({"freeze.policy": "elastic_pipe.freeze:decide"}, "freeze policy 'elastic_pipe.freeze:decide'"),
        ({"pipeline.solver": "magic"}, "unknown partition solver 'magic'"),
        ({"pipeline.schedule": "zigzag"}, "unknown schedule 'zigzag'"),
        ({"pipeline.compression": "os:getcwd"}, "lacks the CompressionRule members"),
        ({"model.name": "resnet"}, "unknown model 'resnet'"),
        (
            {
                "model.options": {"preset": "vit-tiny", "depth": 1},
                "pipeline.pipe_len": 8,
                "launch.nproc_per_node": 8,
                "train.global_batch": 64,
            },
            "longer than",
        ),
        ({"freeze.options": {"beta": 2}}, "freeze policy 'alpha'"),
        ({"data.dataset": "json:loads", "data.options": {"s": "3"}}, "neither samples"),
        ({"data.dataset": "json:loads", "data.options": {"s": "[]"}}, "the dataset is empty"),
    ],
)
def test_preflight_refuses_before_any_process(overrides: dict[str, object], message: str) -> None:
    config = _tiny(overrides)
    with pytest.raises(ConfigError) as exc:
        preflight(config)
    assert message in str(exc.value)


def test_preflight_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.persist import fingerprint
    from elastic_pipe.orchestrator.persist.files import FORMAT, LATEST

    other = build_model(_tiny({"model.options": {"preset": "vit-tiny", "depth": 2}}))
    (tmp_path / LATEST).write_text(json.dumps({"format": FORMAT, "file": "x.pt", "fingerprint": fingerprint(other)}))
    config = _tiny({"checkpoint.dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="another model"):
        preflight(config)
    facts = preflight(config.override({"checkpoint.resume": "never"}))
    assert facts["sublayers"] == 14 and facts["units"] == 6


@pytest.mark.parametrize(
    ("requested", "devices", "ranks", "backend", "reason"),
    [
        ("auto", 0, 1, "gloo", "no CUDA device"),
        ("auto", 1, 1, "nccl", "1 CUDA devices for 1 local ranks"),
        ("auto", 2, 4, "gloo", "4 local ranks but 2 CUDA devices"),
        ("auto", 8, 4, "nccl", "8 CUDA devices for 4 local ranks"),
        ("gloo", 8, 4, "gloo", "as configured"),
        ("nccl", 4, 4, "nccl", "as configured"),
    ],
)
def test_choose_backend(requested: str, devices: int, ranks: int, backend: str, reason: str) -> None:
    from elastic_pipe.orchestrator.launch.process_group import choose_backend

    chosen, why = choose_backend(requested, devices, ranks)
    assert chosen == backend and reason in why


def test_nccl_without_a_device_per_rank_is_refused_by_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.orchestrator.launch.process_group import choose_backend

    with pytest.raises(ConfigError, match="4 ranks, 2 CUDA devices"):
        choose_backend("nccl", 2, 4)
    four = {"launch.nproc_per_node": 4, "launch.backend": "nccl"}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="backend 'nccl' needs a CUDA device per local rank: 4 ranks, 3 CUDA"):
        preflight(_tiny(four))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert preflight(_tiny(four))["sublayers"] == 14


@pytest.mark.parametrize("section", ["checkpoint", "log"])
def test_preflight_needs_writable_directories(section: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = blocker / "sub"  # cannot be created: its parent is a file
    with pytest.raises(ConfigError, match=f"\\[{section}\\] dir '{bad}' is not a writable directory"):
        preflight(_tiny({f"{section}.dir": str(bad)}))
    good = tmp_path / "new" / section
    preflight(_tiny({f"{section}.dir": str(good)}))
    assert good.is_dir() and list(good.iterdir()) == []  # created, the probe removed


def test_preflight_probes_by_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.orchestrator.preflight import check_writable

    def refuse(self: Path, data: bytes) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(ConfigError, match=f"\\[log\\] dir '{tmp_path}' is not a writable directory: Permission denied"):
        check_writable(tmp_path, "[log] dir")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"train.seed": 2**31}, "train.seed must be < SEED_LIMIT = 2**31"),
        ({"launch.timeout": 86_401}, "launch.timeout must be <= MAX_TIMEOUT_S = 86400"),
        ({"train.epochs": 100_001}, "train.epochs must be <= MAX_EPOCHS = 100000"),
    ],
)
def test_numbers_above_their_limits_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", "\\*")):
        _tiny(overrides)


def test_numbers_at_their_limits_are_accepted() -> None:
    c = _tiny({"train.seed": 2**31 - 1, "launch.timeout": 86_400, "train.epochs": 100_000})
    assert (c.train.seed, c.launch.timeout, c.train.epochs) == (2**31 - 1, 86_400, 100_000)


def test_step_seeds_are_distinct_and_fit_a_torch_generator() -> None:
    from elastic_pipe.orchestrator.step_ops import step_seed

    coords = [(s, e, i, r) for s in (0, 1, 2**31 - 1) for e in (0, 1, 99_999) for i in (0, 1, 7) for r in (0, 1, 3)]
    seeds = [step_seed(*c) for c in coords]
    assert len(set(seeds)) == len(coords) and all(0 <= x < 2**64 for x in seeds)
    assert step_seed(0, 1, 2, 3) == step_seed(0, 1, 2, 3)
    torch.Generator().manual_seed(max(seeds))  # the largest is a valid seed


def test_candidate_pipe_lens() -> None:
    four = {"pipeline.pipe_len": 4, "launch.nproc_per_node": 4, "train.global_batch": 64}
    six = {"pipeline.pipe_len": 3, "launch.nproc_per_node": 6, "train.global_batch": 96}
    assert candidate_pipe_lens(_tiny(four)) == (4, 2, 1)
    assert candidate_pipe_lens(_tiny(six)) == (3, 2, 1)


# ------------------------------------------------------------------------------------------------------ decisions
COSTS = [1.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 1.0]  # embed, 3 blocks x (attn, mlp), head


def test_initial_layout_and_halving() -> None:
    layout, budget = initial_layout(COSTS, 4, 4, solver="optimal", microbatches=4)
    assert layout == Layout(0, 4, 1, (0, 2, 4, 6, 8), 4)
    assert budget == 8.0
    # freeze 2 units (5 sub-layers): 1 block + head = 9 > 8 on one stage, 4 + 5 fit on two
    two = next_layout(
        layout, 5, COSTS, compression=COMPRESSION_RULES["halving"], solver="optimal", budget=budget, world_size=4
    )
    assert (two.pipe_len, two.replicas, two.boundaries) == (2, 2, (5, 6, 8))
    one = next_layout(
        two, 7, COSTS, compression=COMPRESSION_RULES["halving"], solver="optimal", budget=budget, world_size=4
    )
    assert (one.pipe_len, one.replicas, one.boundaries) == (1, 4, (7, 8))
    fixed = next_layout(
        layout, 3, COSTS, compression=COMPRESSION_RULES["none"], solver="optimal", budget=budget, world_size=4
    )
    assert (fixed.pipe_len, fixed.replicas, fixed.boundaries) == (4, 1, (3, 4, 5, 6, 8))
    assert (
        next_layout(
            layout, 0, COSTS, compression=COMPRESSION_RULES["halving"], solver="optimal", budget=8.0, world_size=4
        )
        is layout
    )


def test_max_frozen_units() -> None:
    ends = (3, 5, 7)  # 8 sub-layers
    assert max_frozen_units(ends, 8, 1) == 3
    assert max_frozen_units(ends, 8, 3) == 2
    assert max_frozen_units(ends, 8, 6) == 0


# ------------------------------------------------------------------------------------------- transition planning
def test_changed_ranks_for_4_to_2() -> None:
    # transfer plans live in tests/test_training_residency.py
    assert changed_ranks(plan_spmd(4, 4), plan_spmd(4, 2), 4) == (2, 3)


def test_buckets_respect_cap_and_dtype() -> None:
    import torch

    ts = [torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(100), torch.zeros(1)]
    sizes = [[t.numel() for t in b] for b in grad_buckets(ts, 32)]
    assert sizes == [[4, 4], [4], [100], [1]]


# -------------------------------------------------------------------------------------------------------- metrics
def test_event_log_writes_json_lines(tmp_path: Path) -> None:
    import io

    stream = io.StringIO()
    log = EventLog(tmp_path / "logs" / "events.jsonl", stream)
    event = TransitionEvent(
        epoch=2,
        step=40,
        frozen_units=2,
        frozen=5,
        pipe_len=2,
        replicas=2,
        microbatches=4,
        boundaries=(5, 9, 14),
        changed_ranks=(2, 3),
        bytes_moved=1_000_000,
        cache=False,
        seconds=0.25,
        cache_entries=120,
        cache_bytes=120 * 64,
        phases={"decide": 0.05, "moves": 0.1, "freeze": 0.01, "runner": 0.04, "cache": 0.05},
    )
    log.record(event.to_dict(), event.human())
    lines = (tmp_path / "logs" / "events.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "kind": "transition",
        "epoch": 2,
        "step": 40,
        "frozen_units": 2,
        "frozen": 5,
        "pipe_len": 2,
        "replicas": 2,
        "microbatches": 4,
        "boundaries": [5, 9, 14],
        "changed_ranks": [2, 3],
        "bytes_moved": 1_000_000,
        "cache": False,
        "seconds": 0.25,
        "phases": {"decide": 0.05, "moves": 0.1, "freeze": 0.01, "runner": 0.04, "cache": 0.05},
        "epoch_step": 0,
        "prefix_released_bytes": 0,
        "cache_entries": 120,
        "cache_bytes": 120 * 64,
        "virtual": 1,
    }
    assert stream.getvalue() == (
        "transition before epoch 3: frozen 2 units, K=2 R=2, boundaries [5, 9, 14], 1.00 MB moved, cache off, 0.250 s\n"
    )


def test_a_failed_decision_reaches_every_rank() -> None:
    from elastic_pipe.orchestrator import OrchestratorError
    from elastic_pipe.orchestrator.layout.decision import announce, message_for
    from elastic_pipe.partition import PartitionError

    sent: list[bytes] = []

    def broadcast(payload: bytes | None, src: int) -> bytes:
        assert src == 0
        if payload is not None:
            sent.append(payload)
        return sent[-1]

    def fail() -> object:
        raise PartitionError("no pipeline length fits budget=1")

    layout = Layout(0, 2, 1, (0, 4, 8), 2)
    ok = message_for(layout, epoch=1, step=5, budget=4.0, changed=(1,))
    assert announce(lambda: ok, rank=0, broadcast_bytes=broadcast) == ok
    assert announce(lambda: ok, rank=1, broadcast_bytes=broadcast) == ok  # rank 1 reads what rank 0 sent
    for rank in (0, 1):
        with pytest.raises(OrchestratorError, match="rank 0 could not decide: no pipeline length fits budget=1"):
            announce(fail, rank=rank, broadcast_bytes=broadcast)  # type: ignore[arg-type]


def test_phase_clock_counts_only_timed_steps() -> None:
    clock = PhaseClock(torch.device("cpu"), ("a", "b"))
    clock.start(timed=True)
    time.sleep(0.002)
    assert clock.lap("a") > 0
    clock.start(timed=False)
    time.sleep(0.002)
    assert clock.lap("b") == 0.0
    assert clock.timed_steps == 1
    assert clock.totals["a"] > 0 and clock.totals["b"] == 0.0


def test_forward_timer_records_only_while_active() -> None:
    layer = torch.nn.Linear(2, 2)
    timer = ForwardTimer(layer, torch.device("cpu"))
    layer(torch.ones(1, 2))
    timer.active = False
    layer(torch.ones(1, 2))
    assert len(timer._pending) == 1  # the recorded (begin, end) pairs
    assert timer.collect() >= 0 and not timer._pending
    timer.remove()


@pytest.mark.parametrize(
    ("steps", "interval", "timed"),
    [(10, 10, [9]), (25, 10, [9, 19]), (3, 10, [2]), (1, 10, [0]), (4, 1, [0, 1, 2, 3])],
)
def test_timed_steps_skip_the_first_and_cover_every_epoch(steps: int, interval: int, timed: list[int]) -> None:
    assert [i for i in range(steps) if _timed_step(i, steps, interval)] == timed


def test_the_default_policy_is_drift_over_the_run_s_steps() -> None:
    from elastic_pipe.freeze import Drift, FreezeOut
    from elastic_pipe.orchestrator.components import components_from_config, run_steps

    tables = {"model": {"name": "vit", "options": {"preset": "vit-tiny"}}, "train": {"epochs": 3}}
    config = config_from_tables(tables)
    assert (config.freeze.policy, config.freeze.policy_options, config.freeze.decide_every) == ("drift", {}, "auto")
    # digits: 1,797 samples, 20% held out -> 1,437 training samples, 22 whole steps of 64 an epoch (drop_last)
    assert run_steps(config, 1797) == 22 * 3
    policy = components_from_config(config).policy
    assert isinstance(policy, Drift) and (policy.total_steps, policy.settle_after, policy.relative) == (66, 0.8, 0.15)
    capped = components_from_config(config.override({"train.max_steps": 10})).policy
    assert isinstance(capped, Drift) and capped.total_steps == 10
    freezeout = config.override({"freeze.policy": "freezeout"})
    assert freezeout.freeze.policy_options == {"t0": 0.7}
    built = components_from_config(freezeout).policy
    assert isinstance(built, FreezeOut) and (built.t0, built.total_steps) == (0.7, 66)
    given = components_from_config(freezeout.override({"freeze.options": {"t0": 0.5, "total_steps": 7}})).policy
    assert isinstance(given, FreezeOut) and (given.t0, given.total_steps) == (0.5, 7)
    assert config.override({"freeze.policy": "alpha"}).freeze.policy_options == {"alpha": 1 / 3}


def test_seconds_into_adds_each_block_s_time_even_when_it_raises() -> None:
    phases: dict[str, float] = {"stage": 1.0}
    with seconds_into(phases, "stage"):
        time.sleep(0.01)
    with pytest.raises(RuntimeError), seconds_into(phases, "cache"):
        time.sleep(0.01)
        raise RuntimeError("boom")
    assert phases["stage"] >= 1.01 and 0.01 <= phases["cache"] < 1.0


@pytest.mark.parametrize(("epochs", "max_steps", "total"), [(4, 0, 40), (4, 25, 25), (2, 100, 20)])
def test_the_schedule_decays_over_the_steps_the_run_takes(epochs: int, max_steps: int, total: int) -> None:
    train = _tiny({"train.epochs": epochs, "train.max_steps": max_steps, "train.lr_schedule": "cosine"}).train
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = lr_scheduler(opt, train, steps_per_epoch=10)
    factors = [sched.lr_lambdas[0](step) for step in range(total + 1)]
    warm = train.warmup_steps
    assert factors[total] == pytest.approx(0.0, abs=1e-12)
    assert all(f > 0 for f in factors[warm:total])


def test_the_last_evaluation_skips_epochs_that_did_not_evaluate() -> None:
    result = RunResult()
    assert result.last_evaluation() is None
    result.epochs = [{"epoch": 0, "eval_loss": 0.5}, {"epoch": 1, "eval_loss": 0.4}, {"epoch": 2, "eval_loss": None}]
    assert result.last_evaluation() == {"epoch": 1, "eval_loss": 0.4}
