"""A rank's stage: example tensors for its declared shapes, and the runner that steps it."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from elastic_pipe import schedule as sched
from elastic_pipe.orchestrator.data import cross_entropy
from elastic_pipe.orchestrator.stage.build import build_runner
from elastic_pipe.orchestrator.stage.local_step import LocalStep
from elastic_pipe.testing import RankContext, run_distributed, run_tasks


def test_stage_examples_are_the_boundary_activations_widened() -> None:
    from elastic_pipe.orchestrator.setup import boundary_examples
    from elastic_pipe.orchestrator.stage.runtime import _widen

    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(4 + j, 5 + j), nn.Tanh()) for j in range(5)])
    x = torch.randn(1, 4)
    examples = boundary_examples(layers, x, torch.device("cpu"), nullcontext)
    with torch.no_grad():
        at_three = layers[2](layers[1](layers[0](x)))
    assert len(examples) == 6 and torch.equal(examples[3], at_three)
    stage_in = _widen(examples[3], 6, True)  # a stage after the first receives an activation needing a gradient
    assert stage_in.shape == (6, 7) and stage_in.is_contiguous() and stage_in.requires_grad
    assert torch.equal(stage_in[5], at_three[0])


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 8, dtype=torch.float64), nn.GELU(), nn.Linear(8, 4, dtype=torch.float64))


def _one_stage_runners(ctx: RankContext, microbatches: int) -> dict[str, Any]:
    """The same step through torch's one-stage schedule and through whatever ``build_runner`` picks."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(8, 6, dtype=torch.float64, generator=gen)
    y = torch.randint(0, 4, (8,), generator=gen)
    out: dict[str, Any] = {}
    for name in ("torch", "built"):
        model = _model()
        losses: list[torch.Tensor] = []
        if name == "torch":
            from torch.distributed.pipelining import PipelineStage

            stage = PipelineStage(model, 0, 1, torch.device("cpu"), group=dist.group.WORLD)
            runner: Any = sched.torch_schedule(
                sched.generate("1f1b", 1, microbatches), 0, [stage], cross_entropy, scale_grads=True
            )
        else:
            runner = build_runner(
                model,
                stage=0,
                schedule=sched.generate("1f1b", 1, microbatches),
                device=torch.device("cpu"),
                group=dist.group.WORLD,
                # one micro-batch of rows, as the runtime declares (torch < 2.12 checks the declared shape)
                examples=lambda: (x[: 8 // microbatches], torch.zeros(8 // microbatches, 4, dtype=torch.float64)),
                loss_fn=cross_entropy,
            )
            out["local"] = isinstance(runner, LocalStep)
        runner.step(x, target=y, losses=losses)
        out[name] = {
            "loss": float(torch.stack(losses).mean()),
            "grads": [p.grad.tolist() for p in model.parameters()],  # type: ignore[union-attr]
        }
    return out


@pytest.fixture(scope="module")
def one_stage_runners() -> dict[int, dict[str, Any]]:
    """``_one_stage_runners`` for 1 and 2 micro-batches, one after the other in one 1-rank job (starting a rank
    costs more than both runs)."""
    (results,) = run_distributed(run_tasks, 1, {m: (_one_stage_runners, (m,)) for m in (1, 2)}, timeout=120.0)
    return results  # type: ignore[no-any-return]


@pytest.mark.distributed
@pytest.mark.parametrize("microbatches", [1, 2])
def test_one_stage_runner_computes_what_the_torch_schedule_computes(
    one_stage_runners: dict[int, dict[str, Any]], microbatches: int
) -> None:
    result = one_stage_runners[microbatches]
    assert result["local"] == (microbatches == 1)  # one micro-batch: nothing to schedule
    torch.testing.assert_close(result["built"]["loss"], result["torch"]["loss"], rtol=1e-12, atol=1e-12)
    for a, b in zip(result["built"]["grads"], result["torch"]["grads"], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-12, atol=1e-12)


def _train_tiny(overrides: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """A tiny ViT trained on 96 digits by one stage and two replicas, one micro-batch per step (gradients are
    averaged by backward hooks); returns the model and the run's result."""
    from elastic_pipe import models
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import config_from_tables, run_rank
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    tables: dict[str, Any] = {
        "model": {"name": "vit"},
        "train": {"epochs": 1, "global_batch": 32},
        "pipeline": {"microbatches": 1, "pipe_len": 1},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }
    model = models.vit(config="vit-tiny", depth=2, dim=16, heads=2, mlp_dim=32)
    samples = Split(d.inputs[:96], d.labels[:96], d.sample_ids[:96])
    config = config_from_tables(tables).override(overrides)
    result = run_rank(config, model=model, samples=samples, quiet=True)
    return model, result.to_dict()


def _train_then_look_at_hooks(ctx: RankContext) -> dict[str, int]:
    model, _ = _train_tiny({"pipeline.cache": "on", "freeze.policy": "never"})
    hooked = sum(bool(getattr(p, "_post_accumulate_grad_hooks", None)) for p in model.parameters())
    return {"hooked": hooked, "params": sum(1 for _ in model.parameters())}


@pytest.mark.distributed
def test_a_finished_run_leaves_no_hooks_on_the_model(two_rank_runs: list[dict[str, Any]]) -> None:
    for result in (r["hooks"] for r in two_rank_runs):
        assert result["params"] > 0 and result["hooked"] == 0


def _what_is_tracked(ctx: RankContext, policy: str) -> dict[str, Any]:
    from elastic_pipe.orchestrator.layout import executor

    seen: dict[str, Any] = {}
    original = executor.decide

    def spy(ctx: Any, state: Any, stage: Any, **kw: Any) -> Any:
        seen["track"] = ctx.track_gradients
        seen["held"] = len(stage.tracker._layers)  # units whose gradients the tracker sums
        return original(ctx, state, stage, **kw)

    executor.decide = spy  # type: ignore[assignment]
    options = {"alpha": 0.5} if policy == "alpha" else {}
    try:
        _, result = _train_tiny({"train.epochs": 2, "freeze.policy": policy, "freeze.options": options})
    finally:
        executor.decide = original  # the rank runs the next training of the job without the spy
    seen["frozen"] = [e["frozen_units"] for e in result["epochs"]]
    return seen


def _units_decided_by_the_one_rule(ctx: RankContext) -> dict[str, Any]:
    from elastic_pipe.orchestrator.layout import rule

    calls: list[dict[str, Any]] = []
    original = rule.decide_units

    def spy(policy: Any, **kw: Any) -> int:
        units = original(policy, **kw)
        calls.append({**{k: v for k, v in kw.items() if k in ("epoch", "current", "pipe_len")}, "units": units})
        return units

    rule.decide_units = spy  # type: ignore[assignment]
    try:  # the alpha schedule freezes one unit at the decision point before epoch 2 (as above)
        _, result = _train_tiny({"train.epochs": 2, "freeze.policy": "alpha", "freeze.options": {"alpha": 0.5}})
    finally:
        rule.decide_units = original
    return {"calls": calls, "frozen": [e["frozen_units"] for e in result["epochs"]]}


@pytest.fixture(scope="module")
def two_rank_runs() -> list[dict[str, Any]]:
    """The three trainings of the 2-rank tests below, one after the other in one 2-rank job (each test had a job
    of its own: starting the ranks cost more than the training)."""
    tasks: dict[str, tuple[Any, tuple[Any, ...]]] = {"hooks": (_train_then_look_at_hooks, ())}
    tasks.update({policy: (_what_is_tracked, (policy,)) for policy in ("alpha", "autofreeze")})
    tasks["rule"] = (_units_decided_by_the_one_rule, ())
    return run_distributed(run_tasks, 2, tasks, timeout=360)


@pytest.mark.distributed
@pytest.mark.parametrize(("policy", "tracked"), [("alpha", False), ("autofreeze", True)])
def test_gradient_statistics_are_collected_only_for_policies_that_read_them(
    two_rank_runs: list[dict[str, Any]], policy: str, tracked: bool
) -> None:
    for result in (r[policy] for r in two_rank_runs):
        assert result["track"] is tracked
        assert (result["held"] > 0) is tracked
    if policy == "alpha":  # the schedule still freezes without them
        assert result["frozen"] == [0, 1]


@pytest.mark.distributed
def test_the_executor_decides_the_frozen_count_with_the_one_rule(two_rank_runs: list[dict[str, Any]]) -> None:
    """``executor.decide`` calls ``rule.decide_units`` (as the dry run does), not a clamp of its own."""
    for result in (r["rule"] for r in two_rank_runs):
        rank_0_calls = result["calls"]  # rank 0 decides; the other rank applies the broadcast message
        assert result["frozen"] == [0, 1]
        assert len(rank_0_calls) <= 1
    calls = [c for r in two_rank_runs for c in r["rule"]["calls"]]
    assert calls == [{"epoch": 1, "current": 0, "pipe_len": 1, "units": 1}]
