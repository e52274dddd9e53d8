"""benchmarks/gpu/plot_hf_callback.py on the committed results of the trainer-callback benchmark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from script_module import load_script

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
JOBS = ["gpu_1xh100_hf_callback.json", "gpu_1xh100_hf_callback_8epochs.json"]


def _report(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


def test_one_panel_a_job_with_a_point_per_arm_and_seed_and_the_arms_means() -> None:
    pytest.importorskip("matplotlib")
    plot = load_script(Path("benchmarks/gpu/plot_hf_callback.py"), "plot_hf_callback")
    reports = [_report(name) for name in JOBS]
    axes = plot.draw(reports).get_axes()
    assert len(axes) == len(JOBS)
    for ax, report in zip(axes, reports, strict=True):
        arms = report["arms"]
        seeds = len(report["settings"]["seeds"])
        points = [c.get_offsets() for c in ax.collections]
        assert len(points) == 2 * len(arms)  # the seeds' points, then the mean, per arm
        drawn = [name for name in plot.ARMS if name in arms]  # the plot's legend order
        for name, per_seed, mean in zip(drawn, points[::2], points[1::2], strict=True):
            arm = arms[name]
            assert per_seed.shape == (seeds, 2), name
            assert per_seed[:, 0].tolist() == pytest.approx(arm["wall_seconds_by_seed"])
            assert per_seed[:, 1].tolist() == pytest.approx([100 * a for a in arm["accuracy_by_seed"]])
            assert mean[0].tolist() == pytest.approx([arm["wall_seconds_mean"], 100 * arm["accuracy_mean"]])
        none = arms["none"]
        lines = {line.get_linestyle(): line for line in ax.get_lines()}
        assert lines["--"].get_ydata()[0] == pytest.approx(100 * none["accuracy_mean"] - plot.TOLERANCE)
        assert ax.get_title().startswith(f"HF Trainer, {report['settings']['epochs']} epochs, ")
        assert report["commit"][:7] in ax.get_title()


def test_no_result_is_refused() -> None:
    pytest.importorskip("matplotlib")
    plot = load_script(Path("benchmarks/gpu/plot_hf_callback.py"), "plot_hf_callback")
    with pytest.raises(ValueError, match="at least one"):
        plot.draw([])
