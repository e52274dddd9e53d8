"""``[train] cuda_graphs``: the decision rule and the config path anywhere; graph and eager steps agree on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from elastic_pipe.orchestrator import ConfigError, config_from_tables
from elastic_pipe.orchestrator.stage.graph_choice import GraphChoice, decide_graph, graph_pays
from elastic_pipe.orchestrator.stage.graphed_step import WARMUP_STEPS, GraphedStep, step_record
from elastic_pipe.orchestrator.stage.local_step import LocalStep
from elastic_pipe.testing import RankContext, run_distributed

_FULL: dict[str, Any] = {"device_type": "cuda", "pipe_len": 1, "microbatches": 1, "replicas": 1, "rows": 64}


def _decide(mode: str = "auto", **changes: Any) -> GraphChoice:
    return decide_graph(mode, **{**_FULL, "full_rows": 64, **changes})


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_full_one_stage_step_on_cuda_is_graphed(mode: str) -> None:
    assert _decide(mode) == GraphChoice(True)


@pytest.mark.parametrize(
    ("mode", "changes", "reason"),
    [
        ("off", {}, "off ([train] cuda_graphs)"),
        ("auto", {"device_type": "cpu"}, "CUDA graphs need a CUDA device, not cpu"),
        ("on", {"device_type": "cpu"}, "CUDA graphs need a CUDA device, not cpu"),
        ("auto", {"pipe_len": 2}, "a pipelined schedule (pipe_len=2, microbatches=1) runs host logic per step"),
        ("auto", {"microbatches": 4}, "a pipelined schedule (pipe_len=1, microbatches=4) runs host logic per step"),
        ("auto", {"replicas": 2}, "2 replicas average gradients in backward hooks"),
        ("auto", {"rows": 40}, "a short step of 40 rows (full steps have 64) has other shapes"),
        # the first rule that applies names the reason
        ("auto", {"device_type": "cpu", "replicas": 2}, "CUDA graphs need a CUDA device, not cpu"),
    ],
)
def test_unsafe_captures_fall_back_with_a_reason(mode: str, changes: dict[str, Any], reason: str) -> None:
    assert _decide(mode, **changes) == GraphChoice(False, reason)


@pytest.mark.parametrize(
    ("host_s", "wall_s", "use"),
    [(0.0033, 0.0035, True), (0.002, 0.004, True), (0.0019, 0.004, False), (0.005, 0.180, False), (0.0, 0.0, False)],
)
def test_auto_captures_only_host_bound_steps(host_s: float, wall_s: float, use: bool) -> None:
    assert graph_pays(host_s, wall_s).use is use


def test_a_gpu_bound_step_says_where_its_time_went() -> None:
    assert graph_pays(0.005, 0.180) == GraphChoice(
        False, "GPU-bound: 5.0 ms of host work in a 180.0 ms step (auto needs half)"
    )


def test_a_choice_has_a_reason_exactly_when_it_is_no() -> None:
    with pytest.raises(ValueError, match="reason exactly when use is False"):
        GraphChoice(False)
    with pytest.raises(ValueError, match="reason exactly when use is False"):
        GraphChoice(True, "why")


def test_the_config_defaults_to_off_and_names_the_choices() -> None:
    assert config_from_tables({"model": {"name": "vit"}}).train.cuda_graphs == "auto"
    assert config_from_tables({"model": {"name": "vit"}, "train": {"cuda_graphs": "off"}}).train.cuda_graphs == "off"
    with pytest.raises(ConfigError, match=r"train\.cuda_graphs must be one of auto, on, off.*'always'"):
        config_from_tables({"model": {"name": "vit"}, "train": {"cuda_graphs": "always"}})


def test_an_eager_step_record_takes_the_compile_seconds_once() -> None:
    step = LocalStep(nn.Linear(2, 2), nn.functional.mse_loss)
    step.compile_s = 1.5
    first = step_record(step, GraphChoice(False, "CUDA graphs need a CUDA device, not cpu"))
    assert first == {
        "cuda_graph": False,
        "graph_reason": "CUDA graphs need a CUDA device, not cpu",
        "capture_s": 0.0,
        "compile_s": 1.5,
    }
    assert step_record(step, None)["compile_s"] == 0.0


def _records(ctx: RankContext, graphs: str, dtype: str, autocast: str) -> tuple[list[float], list[dict[str, Any]]]:
    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import run_rank
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    config = config_from_tables(
        {
            "model": {"name": "vit"},
            "train": {
                "epochs": 3,
                "global_batch": 32,
                "dtype": dtype,
                "autocast": autocast,
                "compile": "off",
                "cuda_graphs": graphs,
                "optimizer": "adamw",
                "lr": 1e-3,
            },
            "freeze": {"policy": "manual", "options": {"schedule": {1: 1, 2: 2}}},
            "pipeline": {"cache": "on"},
            "log": {"progress": False},
        }
    )
    torch.manual_seed(0)
    model = models.vit(config="vit-tiny", depth=3, dim=32, heads=2, mlp_dim=64)
    samples = Split(d.inputs[:160], d.labels[:160], d.sample_ids[:160])
    result = run_rank(config, model=model, samples=samples, quiet=True)
    return result.losses, [dict(e) for e in result.epochs]


def test_the_epoch_record_says_why_a_cpu_run_has_no_graph() -> None:
    losses, epochs = run_distributed(_records, 1, "auto", "float32", "none", timeout=240)[0]
    assert len(losses) == sum(e["steps"] for e in epochs) > 0
    assert [e["cuda_graph"] for e in epochs] == [False, False, False]
    assert {e["graph_reason"] for e in epochs} == {"CUDA graphs need a CUDA device, not cpu"}
    assert [e["capture_s"] for e in epochs] == [0.0, 0.0, 0.0]


_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@_GPU
def test_graphed_steps_give_the_eager_losses_and_weights_in_float32() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 5)).to(device)
    twin = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 5)).to(device)
    twin.load_state_dict(net.state_dict())
    eager = LocalStep(net, nn.functional.cross_entropy)
    graphed = GraphedStep(LocalStep(twin, nn.functional.cross_entropy), always=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (net, twin)]
    gen = torch.Generator(device="cpu").manual_seed(1)
    eager_losses: list[torch.Tensor] = []
    graph_losses: list[torch.Tensor] = []
    for _ in range(WARMUP_STEPS + 6):
        x = torch.randn(8, 16, generator=gen).to(device)
        y = torch.randint(0, 5, (8,), generator=gen).to(device)
        eager.step(x, target=y, losses=eager_losses)
        graphed.step(x, target=y, losses=graph_losses)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert graphed.captured and not graphed.failure and graphed.capture_s > 0
    torch.testing.assert_close(torch.stack(graph_losses), torch.stack(eager_losses), rtol=1e-6, atol=1e-6)
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@_GPU
def test_graphed_and_eager_training_agree_on_a_gpu() -> None:
    eager, eager_epochs = run_distributed(_records, 1, "off", "float32", "bf16", timeout=240)[0]
    graphed, graph_epochs = run_distributed(_records, 1, "on", "float32", "bf16", timeout=240)[0]
    assert [e["cuda_graph"] for e in eager_epochs] == [False, False, False]
    assert [e["cuda_graph"] for e in graph_epochs] == [True, True, True], graph_epochs
    assert all(e["capture_s"] > 0 for e in graph_epochs)  # each epoch starts a new layout, captured anew
    assert len(graphed) == len(eager) == sum(e["steps"] for e in eager_epochs) > 0
    # bf16 autocast: the same kernels, replayed, so agreement is far inside bf16 tolerance
    assert graphed == pytest.approx(eager, rel=2e-2, abs=2e-2)


class _FakeStream:
    def wait_stream(self, other: object) -> None:
        pass


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: the ops between capture_begin and capture_end run once for
    real, and a replay does nothing, so the static tensors keep what the capture computed (the tests feed the same
    batch every step and never change the weights, so that is what a replay would compute)."""

    fail_at_end = False
    replays = 0

    def capture_begin(self, capture_error_mode: str = "global") -> None:
        assert capture_error_mode == "thread_local"

    def capture_end(self) -> None:
        if _FakeGraph.fail_at_end:
            raise RuntimeError("boom\nmore detail")

    def replay(self) -> None:
        _FakeGraph.replays += 1


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Just enough of torch.cuda for GraphedStep's bookkeeping to run on the CPU."""
    from contextlib import nullcontext

    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(_FakeGraph, "fail_at_end", False)
    monkeypatch.setattr(_FakeGraph, "replays", 0)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(5, 4, generator=gen), torch.randint(0, 3, (5,), generator=gen)


def _eager_grads() -> tuple[list[torch.Tensor], torch.Tensor]:
    net = _net()
    x, y = _batch()
    losses: list[torch.Tensor] = []
    LocalStep(net, nn.functional.cross_entropy).step(x, target=y, losses=losses)
    return [p.grad.clone() for p in net.parameters() if p.grad is not None], losses[0]


@pytest.mark.usefixtures("fake_cuda")
def test_a_graphed_step_hands_the_replayed_gradients_to_the_parameters() -> None:
    expected, expected_loss = _eager_grads()
    net = _net()
    graphed = GraphedStep(LocalStep(net, nn.functional.cross_entropy), always=True)
    x, y = _batch()
    losses: list[torch.Tensor] = []
    for i in range(WARMUP_STEPS + 3):
        graphed.step(x, target=y, losses=losses)
        assert graphed.captured is (i >= WARMUP_STEPS)
        for p, g in zip(net.parameters(), expected, strict=True):
            torch.testing.assert_close(p.grad, g)
        for p in net.parameters():
            p.grad = None  # the step loop's zero_grad(set_to_none=True)
    assert _FakeGraph.replays == 3
    assert len(losses) == WARMUP_STEPS + 3 and len({id(t) for t in losses}) == len(losses)  # copies, not the buffer
    torch.testing.assert_close(torch.stack(losses), expected_loss.expand(len(losses)))
    record = step_record(graphed, GraphChoice(True))
    assert record["cuda_graph"] is True and record["graph_reason"] == "" and record["capture_s"] > 0
    assert step_record(graphed, GraphChoice(True))["capture_s"] == 0.0  # taken once


@pytest.mark.usefixtures("fake_cuda")
def test_a_replay_adds_to_a_gradient_already_there() -> None:
    expected, _ = _eager_grads()
    net = _net()
    graphed = GraphedStep(LocalStep(net, nn.functional.cross_entropy), always=True, warmup=1)
    x, y = _batch()
    graphed.step(x, target=y)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    graphed.step(x, target=y)  # capture, then replay
    assert graphed.captured
    for p, g in zip(net.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, g + 1)


@pytest.mark.usefixtures("fake_cuda")
def test_a_failed_capture_leaves_the_layout_eager_and_says_why() -> None:
    expected, _ = _eager_grads()
    _FakeGraph.fail_at_end = True
    net = _net()
    graphed = GraphedStep(LocalStep(net, nn.functional.cross_entropy), always=True, warmup=1)
    x, y = _batch()
    for _ in range(3):
        graphed.step(x, target=y)
        for p, g in zip(net.parameters(), expected, strict=True):
            torch.testing.assert_close(p.grad, g)  # not the capture's gradients added to the eager ones
        for p in net.parameters():
            p.grad = None
    assert not graphed.captured and _FakeGraph.replays == 0
    assert step_record(graphed, GraphChoice(True))["graph_reason"] == "capture failed: boom"


@pytest.mark.usefixtures("fake_cuda")
def test_auto_leaves_a_gpu_bound_layout_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.orchestrator.stage import graphed_step as cuda_graph

    monkeypatch.setattr(cuda_graph, "graph_pays", lambda host, wall: graph_pays(host, 1e3 * wall + 1.0))
    graphed = GraphedStep(LocalStep(_net(), nn.functional.cross_entropy))
    x, y = _batch()
    for _ in range(WARMUP_STEPS + 2):
        graphed.step(x, target=y)
    assert not graphed.captured and _FakeGraph.replays == 0
    assert step_record(graphed, GraphChoice(True))["graph_reason"].startswith("GPU-bound: ")


@pytest.mark.usefixtures("fake_cuda")
def test_auto_captures_a_host_bound_layout() -> None:
    graphed = GraphedStep(LocalStep(_net(), nn.functional.cross_entropy))  # on the CPU host time is all of it
    x, y = _batch()
    for _ in range(WARMUP_STEPS + 1):
        graphed.step(x, target=y)
    assert graphed.captured and _FakeGraph.replays == 1


def test_a_graphed_step_needs_a_warm_up() -> None:
    with pytest.raises(ValueError, match="warmup must be at least 1, got 0"):
        GraphedStep(LocalStep(_net(), nn.functional.cross_entropy), warmup=0)


class _RecordingGraph:
    """A graph that records the order of the capture calls (and can fail at the end)."""

    def __init__(self, log: list[str], fail_at_end: bool = False) -> None:
        self.log, self.fail_at_end = log, fail_at_end

    def capture_begin(self, capture_error_mode: str = "global") -> None:
        self.log.append(f"begin {capture_error_mode}")

    def capture_end(self) -> None:
        self.log.append("end")
        if self.fail_at_end:
            raise RuntimeError("end failed")


@pytest.mark.usefixtures("fake_cuda")
def test_the_one_capture_recipe_runs_the_body_between_begin_and_end_and_keeps_the_first_error() -> None:
    from elastic_pipe.orchestrator.stage import capture as cuda_graph
    from elastic_pipe.orchestrator.stage import forward_graphs

    assert forward_graphs.capture is cuda_graph.capture  # the probe's graphs and the step's share the recipe
    assert forward_graphs.capture_failure is cuda_graph.capture_failure
    log: list[str] = []

    def body() -> int:
        log.append("body")
        return 7

    assert cuda_graph.capture(_RecordingGraph(log), _FakeStream(), body) == (7, None)  # type: ignore[arg-type]
    assert log == ["begin thread_local", "body", "end"]

    def fails() -> int:
        raise ValueError("inside")

    log.clear()
    result, error = cuda_graph.capture(_RecordingGraph(log, fail_at_end=True), _FakeStream(), fails)  # type: ignore[arg-type]
    assert result is None and isinstance(error, ValueError) and log == ["begin thread_local", "end"]
    assert cuda_graph.capture_failure(error) == "capture failed: inside"
    result, error = cuda_graph.capture(_RecordingGraph(log, fail_at_end=True), _FakeStream(), body)  # type: ignore[arg-type]
    assert result is None and isinstance(error, RuntimeError)  # a failed end voids the body's result
    assert cuda_graph.capture_failure(RuntimeError("first\nsecond")) == "capture failed: first"
    assert cuda_graph.capture_failure(RuntimeError()) == "capture failed: RuntimeError"
