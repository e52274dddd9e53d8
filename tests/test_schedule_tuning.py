"""Micro-batch tuning (with host overhead), Gantt charts and the ``elastic-pipe schedule`` CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from elastic_pipe.cli import main
from elastic_pipe.schedule import (
    LinearCost,
    MissingExtraError,
    ScheduleError,
    StageTimes,
    gantt,
    generate,
    simulate,
    tune_microbatches,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# --- tuning --------------------------------------------------------------------------------------------------------


def _expected_1f1b_makespan(mbs: int, batch: int, pipe_len: int, per_sample: float, host: float) -> float:
    # equal stages: (M + K - 1) slots of one forward + one backward; B = 2F per sample, host split 1/3 : 2/3
    size = batch // mbs
    return (mbs + pipe_len - 1) * (3 * per_sample * size + host)


@pytest.mark.parametrize(("host", "best"), [(0.0, 8), (4e-3, 4)])
def test_host_overhead_moves_the_best_microbatch_count(host: float, best: int) -> None:
    cost = LinearCost.uniform(
        2, forward_per_sample=1e-3, backward_per_sample=2e-3, blocks_per_stage=4, host_per_block=host / 4
    )
    choice = tune_microbatches(cost, global_batch=16, pipe_len=2)
    assert [row.microbatches for row in choice.table] == [2, 4, 8]  # divisors of 16 in [K, 6K] = [2, 12]
    for row in choice.table:
        assert row.makespan == pytest.approx(_expected_1f1b_makespan(row.microbatches, 16, 2, 1e-3, host))
        assert row.throughput == pytest.approx(16 / row.makespan)
        assert row.microbatch_size == 16 // row.microbatches
    assert choice.microbatches == best
    assert choice.to_dict()["table"][0]["microbatches"] == 2


def test_overlapped_host_time_only_shows_when_it_exceeds_device_time() -> None:
    cost = LinearCost((1e-3,), (2e-3,), (3e-3,), overlap=True)
    assert cost(4) == StageTimes((4e-3,), (8e-3,))  # device-bound: host (1 ms / 2 ms) hidden
    at_crossover = cost(1)
    assert at_crossover.forward == (pytest.approx(1e-3),) and at_crossover.backward == (pytest.approx(2e-3),)
    assert cost(0).forward == (pytest.approx(1e-3),)  # host-bound
    additive = LinearCost((1e-3,), (2e-3,), (3e-3,), transfer_per_sample=1e-4, transfer_latency=1e-5)
    assert additive(4).forward == (pytest.approx(5e-3),)
    assert additive(4).transfer == pytest.approx(4.1e-4)


def test_measured_costs_and_explicit_candidates() -> None:
    measured = {8: StageTimes((1.0, 1.0), (2.0, 2.0)), 4: StageTimes((0.6, 0.6), (1.2, 1.2))}
    choice = tune_microbatches(measured, global_batch=16, pipe_len=2, candidates=[2, 4, 3])
    assert [r.microbatches for r in choice.table] == [2, 4]
    assert choice.table[0].makespan == pytest.approx(3 * 3.0)
    assert choice.table[1].makespan == pytest.approx(5 * 1.8)
    assert choice.microbatches == 2  # a tie goes to fewer micro-batches (less per-micro-batch overhead)
    with pytest.raises(ScheduleError, match=r"no measured cost for micro-batch size 2; measured sizes: \[4, 8\]"):
        tune_microbatches(measured, global_batch=16, pipe_len=2, candidates=[8])


def test_tuning_skips_counts_the_schedule_refuses() -> None:
    cost = LinearCost.uniform(4, forward_per_sample=1e-3, backward_per_sample=2e-3, blocks_per_stage=1)
    choice = tune_microbatches(cost, global_batch=48, pipe_len=2, kind="interleaved", chunks=2)
    assert [r.microbatches for r in choice.table] == [2, 4, 6, 8, 12]  # odd counts are not multiples of K=2


def test_tuning_errors() -> None:
    cost = LinearCost.uniform(2, forward_per_sample=1e-3, backward_per_sample=2e-3, blocks_per_stage=1)
    with pytest.raises(ScheduleError, match="divides global_batch=13"):
        tune_microbatches(cost, global_batch=13, pipe_len=2)
    with pytest.raises(ScheduleError, match="one forward_per_sample"):
        LinearCost((1.0,), (1.0, 2.0), (0.0,))
    with pytest.raises(ScheduleError, match="must be a finite number >= 0"):
        StageTimes((1.0,), (-1.0,))


# --- Gantt ---------------------------------------------------------------------------------------------------------


def test_gantt_writes_a_png(tmp_path: Path) -> None:
    sim = simulate(generate("zb1p", 3, 4), 1.0, 2.0)
    out = gantt(sim, tmp_path / "zb.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_gantt_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    sim = simulate(generate("1f1b", 2, 2), 1.0, 2.0)
    with pytest.raises(MissingExtraError, match=r"pip install 'elastic-pipe\[plots\]'"):
        gantt(sim, tmp_path / "x.png")


# --- CLI -----------------------------------------------------------------------------------------------------------


def test_cli_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--kind", "interleaved", "--stages", "2", "--microbatches", "4", "--chunks", "2", "--json"]
    code = main(["schedule", *args])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["actions"] == generate("interleaved", 2, 4, 2).to_text()
    assert doc["stages"] == 4 and doc["ranks"] == 2
    # costs are per stage: a rank runs 2 chunks x 4 micro-batches x (1 + 2); it idles (p - 1)(f + b) = 3
    assert doc["makespan"] == pytest.approx(2 * 4 * 3.0 + 3.0)
    assert doc["bubble_fraction"] == pytest.approx(3.0 / 27.0)
    assert len(doc["peak_activations"]) == 4


def test_cli_costs_inline_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["schedule", "--kind", "gpipe", "--stages", "2", "--microbatches", "1", "--json"]
    assert main([*args, "--costs", '{"forward": [1, 2], "backward": [3, 4], "transfer": 0.5}']) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == pytest.approx(11.0)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"forward": 1, "backward": 1, "overhead": 1}))
    assert main([*args, "--costs", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == pytest.approx(8.0)


def test_cli_text_and_gantt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "s.png"
    assert main(["schedule", "--kind", "1f1b", "--stages", "2", "--microbatches", "3", "--gantt", str(png)]) == 0
    out = capsys.readouterr().out
    assert "rank 0: 0F0 0F1 0B0 0F2 0B1 0B2" in out
    assert "bubble 25.00%" in out
    assert png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--chunks", "3"], "1f1b holds one stage per rank"),
        (["--costs", '{"forward": [1, 2, 3]}'], "forward needs 1 or 2 values, got 3"),
        (["--costs", '{"fwd": 1}'], "unknown keys ['fwd']"),
        (["--costs", '{"forward": "x"}'], "must be a number or a list of numbers"),
        (["--costs", "{nope"], "--costs is not valid JSON"),
        (["--costs", "/no/such/file.json"], "cannot read /no/such/file.json"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(extra: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["schedule", "--kind", "1f1b", "--stages", "2", "--microbatches", "2", *extra])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
