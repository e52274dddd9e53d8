"""``[train] compile``: the config path on every machine; compiled and eager training agree on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from elastic_pipe.orchestrator import ConfigError, config_from_tables
from elastic_pipe.orchestrator.setup import compile_enabled
from elastic_pipe.testing import RankContext, run_distributed


def _config(mode: str) -> Any:
    return config_from_tables({"model": {"name": "vit"}, "train": {"compile": mode}})


@pytest.mark.parametrize(
    ("mode", "device", "on"),
    [("auto", "cpu", False), ("auto", "cuda", True), ("on", "cpu", True), ("off", "cuda", False)],
)
def test_compile_is_on_by_default_only_on_gpus(mode: str, device: str, on: bool) -> None:
    assert compile_enabled(_config(mode), torch.device(device)) is on


def test_an_unknown_compile_mode_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"train\.compile must be one of auto, on, off"):
        _config("sometimes")


def _losses(ctx: RankContext, mode: str) -> list[float]:
    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import run_rank
    from elastic_pipe.orchestrator.workload import Split

    d = load_digits()
    config = config_from_tables(
        {
            "model": {"name": "vit"},
            "train": {"epochs": 2, "global_batch": 32, "autocast": "bf16", "compile": mode},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 2}}},
            "pipeline": {"cache": "on"},
            "log": {"progress": False},
        }
    )
    model = models.vit(config="vit-tiny", depth=3, dim=32, heads=2, mlp_dim=64)
    result = run_rank(config, model=model, samples=Split(d.inputs[:320], d.labels[:320], d.sample_ids[:320]))
    return result.losses


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_and_eager_training_agree_on_a_gpu() -> None:
    eager = run_distributed(_losses, 1, "off", timeout=240)[0]
    compiled = run_distributed(_losses, 1, "on", timeout=240)[0]
    assert len(eager) == len(compiled) == 16
    # bf16 autocast: kernels differ between eager and compiled, so agreement is to bf16 tolerance
    assert compiled == pytest.approx(eager, rel=3e-2, abs=3e-2)
