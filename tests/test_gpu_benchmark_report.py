"""The GPU benchmark's pure pieces, on synthetic results: run-time accounting, top-level fields and the plot."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from elastic_pipe import models
from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.orchestrator.data import Split
from elastic_pipe.testing import RankContext, run_distributed
from script_module import load_script


def _load(name: str) -> ModuleType:
    return load_script(Path("benchmarks/gpu") / f"{name}.py", f"bench_{name}")


def _arm(epoch_seconds: list[float], transitions: list[float]) -> dict[str, Any]:
    return {
        "epoch_seconds": epoch_seconds,
        "transition_seconds": transitions,
        "samples_per_s": [100.0 / s for s in epoch_seconds],
    }


def test_run_time_counts_transitions_and_one_warm_up_per_arm() -> None:
    bench = _load("bench_elastic_gpu")
    elastic = _arm([1.2, 0.5, 0.25], [0.1, 0.05])
    assert bench.run_time(elastic, 3) == pytest.approx(1.2 + 0.5 + 0.25 + 0.15)
    # A static arm measured for 3 epochs of a 10-epoch run: its first epoch once, its steady mean for the rest.
    static = _arm([1.3, 1.0, 1.1], [])
    assert bench.run_time(static, 10) == pytest.approx(1.3 + 1.05 * 9)


def _report(workloads: list[str]) -> dict[str, Any]:
    arms = {
        "static_ddp": _arm([1.1, 1.0], []),
        "static_pipe2_1f1b_m4": _arm([1.4, 1.3], []),
        "elastic_cache": _arm([1.1, 0.5, 0.3], [0.1, 0.1]),
    }
    summary = {
        "baseline": "static_ddp",
        "speedup_elastic_cache": 2.0,
        "ideal_speedup": 2.5,
        "fraction_of_ideal": {"elastic_cache": 0.8},
        "transition_seconds": [0.1, 0.1],
        "arms": arms,
        "fits_budget": {"static_ddp": False},
        "run_seconds": {"static_ddp": 10.0, "static_pipe2_1f1b_m4": 13.0, "elastic_cache": 5.0},
        "transition_seconds_total": {"static_ddp": 0.0, "static_pipe2_1f1b_m4": 0.0, "elastic_cache": 0.2},
        "speedup_over_baseline": {"static_ddp": 1.0, "static_pipe2_1f1b_m4": 0.77, "elastic_cache": 2.0},
    }
    return {"device": "GPU", "gpus": 2, "epochs": 3, "workloads": {w: summary for w in workloads}}


def test_headline_fields_sit_at_the_top_level() -> None:
    bench = _load("bench_elastic_gpu")
    one = bench.headline(_report(["vit"]))
    assert one["baseline"] == "static_ddp" and one["speedup_elastic_cache"] == 2.0
    assert set(one) == set(bench.HEADLINE)
    two = bench.headline(_report(["vit", "gpt"]))
    assert two["ideal_speedup"] == {"vit": 2.5, "gpt": 2.5}


def test_plot_has_a_throughput_and_a_run_time_panel_per_workload() -> None:
    pytest.importorskip("matplotlib")
    plot = _load("plot_gpu_results")
    fig = plot.draw(_report(["vit", "gpt"]))
    axes = fig.get_axes()
    assert len(axes) == 4
    throughput, run_time = axes[0], axes[1]
    assert len(throughput.get_lines()) == 3  # one line per arm
    labels = [t.get_text() for t in run_time.get_yticklabels()]
    assert labels == ["static DDP (over budget)", "static 2-stage 1F1B M=4", "elastic + cache"]
    # two bars per arm (epochs, transitions); the over-budget arm is hatched
    assert len(run_time.patches) == 6
    assert run_time.patches[0].get_hatch() == "//" and not run_time.patches[2].get_hatch()


def test_policy_specs_become_freeze_overrides() -> None:
    bench = _load("bench_elastic_gpu")
    assert bench.policy_settings("alpha=0.1", 200) == {"freeze.policy": "alpha", "freeze.options": {"alpha": 0.1}}
    assert bench.policy_settings("autofreeze", 200)["freeze.options"] == {"percentile": 50.0}
    assert bench.policy_settings("freezeout=0.5", 200)["freeze.options"] == {"t0": 0.5, "total_steps": 200}
    for bad in ("alpha", "alpha=x", "sgd=1", "freezeout"):
        with pytest.raises(SystemExit, match="--policies"):
            bench.policy_settings(bad, 200)


def _torch_ddp_two_epochs(ctx: RankContext) -> dict[str, Any]:
    bench = _load("bench_elastic_gpu")
    gen = torch.Generator().manual_seed(0)
    samples = Split(
        torch.randn(80, 1, 8, 8, generator=gen), torch.randint(0, 10, (80,), generator=gen), torch.arange(80)
    )
    model = models.vit("vit-tiny")
    config = config_from_tables(
        {
            "model": {"name": "vit"},
            "train": {"epochs": 2, "global_batch": 16, "optimizer": "adamw", "lr": 1e-3},
            "launch": {"nproc_per_node": 2},
        }
    )
    result = bench.torch_ddp(config, model, samples)
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    return {"epochs": result["epochs"], "losses": result["losses"], "checksum": checksum}


def test_torch_ddp_baseline_trains_in_step_on_every_rank() -> None:
    results = run_distributed(_torch_ddp_two_epochs, 2, timeout=120.0)
    for r in results:
        assert [e["replicas"] for e in r["epochs"]] == [2, 2]
        assert all(e["samples_per_s"] > 0 for e in r["epochs"])
        assert len(r["losses"]) == 2
    # DDP averages gradients, so both replicas hold the same weights after training - and they did train.
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-9)
    assert results[0]["losses"][0] != results[0]["losses"][1]


def test_arms_are_sectioned_configs_and_policy_specs_override_them() -> None:
    bench = _load("bench_elastic_gpu")
    w = bench.workload("vit", True, torch.device("cpu"), 2)
    arms = bench.arm_configs(w, True, 3, 2, 2)
    assert sorted(k for k in arms if k.startswith("static_pipe")) == [
        "static_pipe2_1f1b_m4",
        "static_pipe2_1f1b_m8",
        "static_pipe2_gpipe_m4",
        "static_pipe2_gpipe_m8",
    ]
    ddp = arms["static_ddp"]
    assert (ddp.freeze.policy, ddp.freeze.options, ddp.train.epochs, ddp.pipeline.cache) == ("never", {}, 3, "off")
    pipe = arms["static_pipe2_gpipe_m8"].pipeline
    assert (pipe.pipe_len, pipe.schedule, pipe.microbatches, pipe.microbatches_by_pipe_len) == (2, "gpipe", 8, {2: 8})
    elastic = arms["elastic_cache"]
    assert elastic.freeze.options == {"alpha": bench.ALPHA} and elastic.train.epochs == bench.EPOCHS
    assert (elastic.pipeline.compression, elastic.pipeline.cache) == ("halving", "on")
    freezeout = elastic.override(bench.policy_settings("freezeout=0.5", 200)).freeze
    assert (freezeout.policy, freezeout.options) == ("freezeout", {"t0": 0.5, "total_steps": 200})


def test_the_disk_benchmarks_epoch_profile_covers_only_its_epoch(tmp_path: Path) -> None:
    bench = _load("bench_disk_data_gpu")
    path = tmp_path / "profile.txt"
    profile = bench.EpochProfile(1, path)
    profile.after(0)  # epoch 0 not profiled
    torch.cumsum(torch.ones(64), 0)
    profile.after(1)  # epoch 1 starts
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    assert not path.exists()
    profile.after(2)  # epoch 1 done
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# epoch 1,")
    assert "## by self_cpu_time_total" in text and "## by self_cuda_time_total" in text
    assert "aten::mm" in text and "aten::cumsum" not in text
    profile.after(3)  # nothing more
    assert path.read_text(encoding="utf-8") == text


def test_a_compiled_arms_breakdown_is_what_the_arm_added_largest_first() -> None:
    bench = _load("bench_single_gpu")
    before = {"graphs": 2.0, "_compile.compile_inner": 1.0, "compile_fx.<locals>.bw_compiler": 0.5, "tiny": 0.2}
    after = {
        "graphs": 6.0,
        "_compile.compile_inner": 4.5,
        "compile_fx.<locals>.bw_compiler": 5.0,
        "tiny": 0.205,  # grew by 5 ms: left out
        "async_compile.wait": 2.0,  # a metric the arm recorded first
    }
    out = bench.compile_breakdown(before, after)
    assert out == {
        "graphs": 4.0,
        "compile_fx.<locals>.bw_compiler": 4.5,
        "_compile.compile_inner": 3.5,
        "async_compile.wait": 2.0,
    }
    assert list(out) == ["graphs", "compile_fx.<locals>.bw_compiler", "_compile.compile_inner", "async_compile.wait"]
    snap = bench.compile_snapshot()  # torch's own tables, whatever this process compiled so far
    assert snap["graphs"] >= 0 and all(v >= 0 for v in snap.values())
