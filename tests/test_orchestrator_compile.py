"""``[train] compile``: the config path on every machine; compiled and eager training agree on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from elastic_pipe.orchestrator import ConfigError, config_from_tables
from elastic_pipe.orchestrator.compilation import compile_enabled, compile_seconds, compile_sublayers
from elastic_pipe.orchestrator.stage.local_step import LocalStep
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


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


def _new_graphs_for_a_later_stage(grad_input: bool) -> int:
    """Graphs compiled when a stage that starts at a block (behind a frozen prefix) first runs, after a stage
    that started before it (the block then received a gradient-carrying input) ran once."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    embed = torch.nn.Linear(4, 8)
    blocks = [_Block(), _Block()]
    compiled = [torch.compile(b) for b in blocks]
    head = torch.nn.Linear(8, 3)
    loss = torch.nn.functional.cross_entropy
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    LocalStep(torch.nn.Sequential(embed, *compiled, head), loss, compiled=True).step(x, target=y)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    later = LocalStep(torch.nn.Sequential(compiled[1], head), loss, compiled=True, grad_input=grad_input)
    later.step(embed(x).detach(), target=y)  # the frozen prefix's output: no gradient
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"] - before)


@pytest.mark.slow
# torch's own warnings while it compiles on the CPU (inductor imports torch.jit; dynamo probes .grad of non-leaves)
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_a_compiled_stage_behind_the_frozen_prefix_compiles_nothing_new() -> None:
    t0 = compile_seconds()
    assert _new_graphs_for_a_later_stage(grad_input=True) == 0
    assert compile_seconds() > t0  # the first stage's compilation was measured
    # without the gradient-carrying input the block's code is compiled a second time (the guard the trick avoids)
    assert _new_graphs_for_a_later_stage(grad_input=False) >= 1


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_each_micro_batch_size_runs_code_compiled_for_that_size_alone() -> None:
    # torch's default would compile batch 4 statically, recompile at 3 with a symbolic batch and run 5 and 4 on
    # that (2 graphs): the code a step runs would depend on the sizes seen before, and a resumed run's would differ
    torch._dynamo.reset()
    torch.manual_seed(0)
    (layer,) = compile_sublayers(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        outputs = {n: layer(torch.ones(n, 4)) for n in (4, 3, 5)}
        again = layer(torch.ones(4, 4))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 3
    assert torch.equal(again, outputs[4])


def _losses(ctx: RankContext, mode: str) -> list[float]:
    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import run_rank
    from elastic_pipe.orchestrator.data import Split

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
