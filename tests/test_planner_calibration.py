"""The cost model against measurements: ViT-B/16 steps timed on an H200, the GPU benchmark's measured epochs of
the orchestrator, and a run on this CPU. The measured data and its readers live in
``benchmarks/planner_calibration.py``; the library's pure prediction functions in ``planner.calibration``."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from elastic_pipe.planner import ClusterSpec, PlannerError, model_shape, model_work, price
from elastic_pipe.planner.calibration import ArmMeasurement, CalibrationRow, format_rows, predict_arms
from script_module import load_script


def _load() -> ModuleType:
    return load_script(Path("benchmarks/planner_calibration.py"))


calibration = _load()
CALIBRATION_TOLERANCE = calibration.CALIBRATION_TOLERANCE
cpu_calibration = calibration.cpu_calibration
gpu_benchmark_calibration = calibration.gpu_benchmark_calibration
h200_calibration = calibration.h200_calibration
load_gpu_benchmark = calibration.load_gpu_benchmark

#: A ratio whose measured value is this close to zero is judged by absolute error (1% of a full step): the
#: relative error of 0.02 vs 0.01 says nothing about the step times the planner adds up.
NEAR_ZERO = 0.05
ABSOLUTE_TOLERANCE = 0.01
#: The CPU run shares two cores with other work: the test accepts anything within a factor of two; the honest
#: error of a quiet run is in docs/planner.md.
CPU_FACTOR = 2.0


@pytest.mark.parametrize("row", h200_calibration(), ids=lambda r: r.name)
def test_h200_measurements_are_predicted_within_15_percent(row: object) -> None:
    measured, predicted = row.measured, row.predicted  # type: ignore[attr-defined]
    if measured < NEAR_ZERO:
        assert abs(predicted - measured) <= ABSOLUTE_TOLERANCE
    else:
        assert abs(predicted / measured - 1.0) <= CALIBRATION_TOLERANCE


def test_h200_table_covers_the_reference_numbers() -> None:
    names = [r.name for r in h200_calibration()]
    assert len(names) == 17
    assert any("DDP" in n for n in names) and any("1F1B" in n for n in names) and any("ideal" in n for n in names)


def test_cpu_run_is_predicted_from_its_profile() -> None:
    rows = cpu_calibration(blocks=4, width=256, batch=64, frozen=(0, 2), repeats=5)
    for row in rows:
        assert 1 / CPU_FACTOR <= row.predicted / row.measured <= CPU_FACTOR, row
    # Freezing must show up in both: the frozen run is cheaper, measured and predicted.
    assert rows[1].predicted < rows[0].predicted and rows[1].measured < rows[0].measured


# --- the GPU benchmark (benchmarks/results/gpu_2xh200_vit.json, 2x H200, torch 2.11, ViT-B/16, batch 512) --------
# A copy of the measured numbers the calibration needs, so that the test does not depend on the results file.
_FROZEN = (0, 4, 7, 9, 10, 11, 11, 12, 12, 12)
MEASURED_ARMS = {
    "static_ddp": ArmMeasurement(
        "static_ddp", (0, 0), False, (4163.600355265058, 4952.724187222313), (1.2297049579999992, 1.0337745060000003)
    ),
    "freeze_only": ArmMeasurement(
        "freeze_only",
        _FROZEN,
        False,
        (4071.65, 6396.90, 8285.44, 10395.35, 11764.61, 13588.23, 13665.65, 15569.35, 15740.42, 15847.04),
        (1.25747, 0.80039, 0.61795, 0.49253, 0.43520, 0.37680, 0.37466, 0.32885, 0.32528, 0.32309),
    ),
    "elastic_cache": ArmMeasurement(
        "elastic_cache",
        _FROZEN,
        True,
        (4023.63, 7078.21, 11495.85, 18215.74, 25854.63, 44568.33, 47541.86, 142548.11, 145781.26, 144012.64),
        (1.27248, 0.72335, 0.44538, 0.28108, 0.19803, 0.11488, 0.10769, 0.03592, 0.03512, 0.03555),
    ),
    "static_pipe2_1f1b_m8": ArmMeasurement(
        "static_pipe2_1f1b_m8", (0, 0), False, (3255.91, 3787.37), (1.57253, 1.35186), pipe_len=2, microbatches=8
    ),
}


def test_gpu_benchmark_epochs_are_predicted_within_15_percent() -> None:
    rows = gpu_benchmark_calibration(MEASURED_ARMS)
    # One row per steady epoch (the first epoch of every arm is warm-up and left out) plus one run row per arm.
    assert len(rows) == (1 + 1) + (9 + 1) + (9 + 1) + (1 + 1)
    assert not any("epoch 0 " in r.name for r in rows)
    assert [r.measured for r in rows if r.name.startswith("elastic_cache, epoch")] == list(
        MEASURED_ARMS["elastic_cache"].samples_per_s[1:]
    )
    run = next(r for r in rows if r.name == "freeze_only, steady epochs: run time")
    assert run.measured == pytest.approx(sum(MEASURED_ARMS["freeze_only"].epoch_seconds[1:]))
    for row in rows:
        assert abs(row.error) <= CALIBRATION_TOLERANCE, row


def test_gpu_benchmark_file_is_read(tmp_path: Path) -> None:
    arm = {
        "config": {"global_batch": 512, "microbatches": 8, "microbatches_by_pipe_len": {"1": 1}, "schedule": "1f1b"},
        "frozen_units": [0, 4],
        "cache": [False, True],
        "samples_per_s": [4000.0, 7000.0],
        "epoch_seconds": [1.28, 0.73],
        "pipe_len": [1, 1],
    }
    doc = {"gpus": 2, "workloads": {"vit": {"steps_per_epoch": 10, "arms": {"elastic_cache": arm, "other": arm}}}}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(doc))
    loaded = load_gpu_benchmark(path)
    assert (loaded["gpus"], loaded["global_batch"], loaded["steps_per_epoch"]) == (2, 512, 10)
    assert loaded["arms"] == {
        "elastic_cache": ArmMeasurement("elastic_cache", (0, 4), True, (4000.0, 7000.0), (1.28, 0.73), 1, 1, "1f1b")
    }
    path.write_text(json.dumps({"gpus": 2, "workloads": {}}))
    with pytest.raises(PlannerError, match="not a GPU benchmark result"):
        load_gpu_benchmark(path)


def test_arm_measurement_needs_one_number_per_epoch() -> None:
    with pytest.raises(PlannerError, match="one frozen count"):
        ArmMeasurement("x", (0, 1), False, (1.0,), (1.0, 2.0))


def test_predict_arms_takes_the_costs_and_the_warm_up_as_arguments() -> None:
    cluster = ClusterSpec(2, gpus_per_node=2)
    costs = price(model_work(model_shape("vit-b16")), cluster.gpu)
    arms = {"static_ddp": MEASURED_ARMS["static_ddp"]}
    rows = predict_arms(arms, costs, cluster, global_batch=512, steps_per_epoch=10, warmup_epochs=0)
    assert [r.name for r in rows] == [
        "static_ddp, epoch 0 (0 frozen)",
        "static_ddp, epoch 1 (0 frozen)",
        "static_ddp, steady epochs: run time",
    ]
    assert rows[0].predicted == rows[1].predicted  # same layout, no freezing: the same prediction
    default = predict_arms(arms, costs, cluster, global_batch=512, steps_per_epoch=10)
    assert [r.name for r in default] == ["static_ddp, epoch 1 (0 frozen)", "static_ddp, steady epochs: run time"]


def test_format_rows_is_a_markdown_table() -> None:
    text = format_rows([CalibrationRow("step", "ms", 100.0, 110.0), CalibrationRow("ratio", "x", 0.5, 0.25)])
    assert text.splitlines()[2:] == ["| step | ms | 100 | 110 | +10.0% |", "| ratio | x | 0.5 | 0.25 | -50.0% |"]
