"""Frozen-aware stages (issue #43): a stage whose input needs no gradient and a stage with no trainable parameter
train under every schedule, through a transition, as a one-process run does.

The model is ``frozen_toy``'s (parameter-free sub-layers that count what autograd saves for backward) cut by a
solver that gives those sub-layers stages of their own: ``flatten`` alone on stage 0, and after unit 0 freezes
``tanh0`` alone on stage 0 behind the frozen prefix; with 2 stages per rank ``squash`` alone on stage 1 (behind
``flatten``: its input needs no gradient either), and after the freeze ``tanh1`` alone on stage 2 (no parameter,
but an input that needs a gradient); with the user's ``lin0`` frozen, a stage of frozen parameters outside the
frozen prefix. Float64 on CPU, same seed, data order, global batch and freeze decisions as the reference: the
losses agree to 1e-10. Each run also says what the stages did: a stage behind nothing trainable built no autograd
graph and saved nothing for backward, a rank whose stages train nothing ran no gradient all-reduce and its
optimizer holds no parameter, and every stage behind a trainable one kept its graph.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

import frozen_toy
from elastic_pipe.orchestrator.dry_run import planned_epochs
from elastic_pipe.orchestrator.stage.build import splits_backward
from elastic_pipe.orchestrator.stage.runtime import gradient_from
from elastic_pipe.schedule import generate
from elastic_pipe.testing import RankContext, run_distributed

#: A 160-sample slice of the digits: 128 train, 4 steps of 32 per epoch, 2 epochs, the transition between them.
SAMPLES = 160
STEPS = (SAMPLES - SAMPLES // 5) // 32


def test_a_gradient_crosses_the_boundaries_after_the_first_trainable_sub_layer() -> None:
    boundaries = (3, 4, 5, 7)  # after unit 0 freezes, leading singles over 3 stages: tanh0 | lin1 | tanh1 head
    assert gradient_from(4, boundaries, split_backward=False) == 5  # tanh0's and lin1's inputs need none
    # a split backward finds lin1's weight gradient through its input's: one crosses lin1's input boundary too
    assert gradient_from(4, boundaries, split_backward=True) == 4
    assert gradient_from(3, (3, 7), split_backward=True) == 3  # the first stage: its input is the prefix's output
    assert gradient_from(7, boundaries, split_backward=True) == 8  # nothing trains: no gradient anywhere
    assert splits_backward(generate("zb1p", 2, 2, 1))
    assert not any(splits_backward(generate(s, 2, 2, 1)) for s in ("gpipe", "1f1b"))
    assert not splits_backward(generate("interleaved", 2, 2, 2))
    assert not splits_backward(generate("zb1p", 1, 1, 1))  # one stage, one micro-batch: a LocalStep, one backward


def _config(
    optimizer: str = "sgd", freeze: dict[int, int] | None = None, model: dict[str, Any] | None = None, **pipeline: Any
) -> Any:
    from elastic_pipe.orchestrator import config_from_tables

    tables: dict[str, Any] = {
        "model": {"name": "frozen_toy:toy_model", "options": model or {}},
        "train": {"dtype": "float64", "epochs": 2, "global_batch": 32, "optimizer": optimizer, "lr": 0.05},
        "freeze": {"policy": "manual", "options": {"schedule": {1: 1} if freeze is None else freeze}},
        "pipeline": {"microbatches": 2, "solver": "frozen_toy:leading_singles", "cache": "off", **pipeline},
        "launch": {"nproc_per_node": pipeline.get("pipe_len", 1)},
        "log": {"progress": False},
    }
    if optimizer == "sgd":
        tables["train"]["momentum"] = 0.9
    return config_from_tables(tables)


def _samples() -> Any:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    return Split(d.inputs[:SAMPLES], d.labels[:SAMPLES], d.sample_ids[:SAMPLES])


class _CountingDist(types.ModuleType):
    """``torch.distributed`` as the gradient averaging module sees it, its ``all_reduce`` calls counted."""

    def __init__(self, dist: types.ModuleType) -> None:
        super().__init__("counting_dist")
        self._dist, self.calls = dist, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)

    def all_reduce(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._dist.all_reduce(*args, **kwargs)


def _train(ctx: RankContext, config: Any) -> dict[str, Any]:
    """Train ``config`` with every gradient all-reduce counted and each step's gradient sync recorded by the
    stages the rank held; returns the run, the toy's record and the parameters the optimizer held in each layout."""
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.stage import grad_sync, runtime
    from elastic_pipe.orchestrator.transition import holdings

    frozen_toy.RECORD.clear()
    counting = _CountingDist(grad_sync.dist)
    syncs: dict[str, list[int]] = {}  # the rank's stage ranges -> [steps, all-reduces reported, all-reduces run]
    seen = 0
    original = runtime.StageRuntime.grad_sync

    def grad_sync_counted(stage: runtime.StageRuntime) -> int:
        nonlocal seen
        ops = original(stage)  # the one-micro-batch averager's all-reduces ran during the backward, before this
        entry = syncs.setdefault(str([list(r) for r in stage._ranges]), [0, 0, 0])
        entry[0] += 1
        entry[1] += ops
        entry[2] += counting.calls - seen
        seen = counting.calls
        return ops

    optimizer_params: dict[str, int] = {}  # each layout's boundaries -> parameters the rank's optimizer holds
    point = holdings.point_optimizer

    def point_counted(ctx: Any, optimizer: Any, layout: Any) -> None:
        point(ctx, optimizer, layout)
        optimizer_params[str(list(layout.boundaries))] = sum(len(g["params"]) for g in optimizer.param_groups)

    grad_sync.dist = counting  # type: ignore[assignment]
    runtime.StageRuntime.grad_sync = grad_sync_counted  # type: ignore[method-assign]
    holdings.point_optimizer = point_counted
    try:
        with ElasticTrainer(config, data=_samples(), quiet=True) as trainer:
            result = trainer.fit().to_dict()
            groups = len(trainer.optimizer.param_groups)
    finally:
        grad_sync.dist = counting._dist  # type: ignore[assignment]
        runtime.StageRuntime.grad_sync = original  # type: ignore[method-assign]
        holdings.point_optimizer = point
    return {
        "result": result,
        "record": dict(frozen_toy.RECORD),
        "syncs": syncs,
        "optimizer_params": optimizer_params,
        "groups": groups,
    }


def _references(ctx: RankContext) -> dict[str, Any]:
    return {name: _train(ctx, _config(name))["result"] for name in ("sgd", "adamw")}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The whole model in one process, no pipeline, with the freeze the elastic runs make (SGD and AdamW)."""
    (results,) = run_distributed(_references, 1, timeout=120)
    return results  # type: ignore[no-any-return]


def _check_optimizers(runs: list[dict[str, Any]], layouts: list[list[int]], trainable: tuple[int, ...]) -> None:
    """In each layout the optimizer of every rank held the weight and bias of each trainable sub-layer of its
    stages (``trainable``: the toy's ``Linear`` sub-layers the user did not freeze), and nothing else: none for a
    rank whose stages train nothing."""
    for rank, run in enumerate(runs):
        position = rank % 2  # 2 pipeline ranks; stage s on position s % 2
        for b in layouts:
            held = [j for s in range(position, len(b) - 1, 2) for j in range(b[s], b[s + 1])]
            assert run["optimizer_params"][str(b)] == 2 * len(set(held) & set(trainable)), (rank, b)
    assert {r["groups"] for r in runs} == {1}  # the config's one group stays, empty where nothing trains


def _check_record(runs: list[dict[str, Any]], forwards: int, *, split: bool = False) -> None:
    """The parameter-free sub-layers' record summed over the ranks: ``forwards`` training forwards per epoch
    (``split``: a schedule that splits the backward, ``zb1p``)."""
    total: dict[str, list[int]] = {}
    for run in runs:
        for name, counts in run["record"].items():
            total[name] = [a + b for a, b in zip(total.get(name, [0, 0, 0]), counts, strict=True)]
    # flatten runs alone on stage 0, behind nothing trainable (then in the frozen prefix, in eval mode): no forward
    # of it built a graph or saved a tensor for backward
    assert total["flatten"] == [forwards, 0, 0]
    # so does squash, alone on stage 1 with 2 stages per rank, or with lin0 on stage 1; but a split backward
    # keeps an input gradient at the stage holding the first trainable sub-layer (torch finds the weight
    # gradients through it), so squash's output there carries a graph, that one tanh saving its output
    assert total["squash"] == ([forwards, forwards, forwards] if split else [forwards, 0, 0])
    # tanh0 trains behind lin0 in the first layout; in the second it is the first stage behind the frozen prefix
    assert total["tanh0"] == [2 * forwards, forwards, forwards]
    # tanh1 is behind a trainable sub-layer in every layout (alone on a stage with 2 per rank): it keeps its graph
    assert total["tanh1"] == [2 * forwards, 2 * forwards, 2 * forwards]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("schedule", "virtual", "cache", "boundaries"),
    [
        ("gpipe", 1, "off", [[0, 1, 7], [3, 4, 7]]),
        ("1f1b", 1, "on", [[0, 1, 7], [3, 4, 7]]),
        ("zb1p", 1, "off", [[0, 1, 7], [3, 4, 7]]),
        ("interleaved", 2, "off", [[0, 1, 2, 3, 7], [3, 4, 5, 6, 7]]),
    ],
)
def test_stages_without_parameters_or_input_gradient_train_as_one_process(
    schedule: str, virtual: int, cache: str, boundaries: list[list[int]], reference: dict[str, Any]
) -> None:
    config = _config(pipe_len=2, virtual=virtual, schedule=schedule, compression="none", cache=cache)
    runs = run_distributed(_train, 2, config, timeout=180)
    run, fixed = runs[0]["result"], reference["sgd"]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in run["epochs"]] == [(0, 2, 1), (1, 2, 1)]
    (transition,) = run["transitions"]
    assert transition["boundaries"] == boundaries[1]
    assert [e["boundaries"] for e in planned_epochs(config)] == boundaries  # the dry run agrees
    assert [e["cache"] for e in run["epochs"]] == [False, cache == "on"]
    assert len(run["losses"]) == len(fixed["losses"]) == 2 * STEPS
    assert run["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert runs[1]["result"]["losses"] == run["losses"]
    assert run["losses"][-1] != pytest.approx(run["losses"][0], rel=1e-3)  # training did something
    _check_record(runs, STEPS * 2, split=schedule == "zb1p")  # 2 micro-batches a step
    # rank 0 holds flatten (with lin0 on 2 stages per rank), then tanh0 (and tanh1) behind the frozen prefix
    _check_optimizers(runs, boundaries, (2, 4, 6))
    assert [runs[0]["optimizer_params"][str(boundaries[1])], runs[1]["optimizer_params"][str(boundaries[1])]] == [0, 4]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("schedule", "virtual", "microbatches", "free"),
    [
        # 1 micro-batch: the averaging that overlaps the backward; rank 0 and 2 hold flatten, then tanh0
        ("1f1b", 1, 1, {"[[0, 1]]", "[[3, 4]]"}),
        # 2 stages per rank: ranks 0 and 2 end holding tanh0 and tanh1, two stages with nothing to train
        ("interleaved", 2, 2, {"[[3, 4], [5, 6]]"}),
    ],
)
def test_a_stage_without_parameters_averages_no_gradient_over_its_replicas(
    schedule: str, virtual: int, microbatches: int, free: set[str], reference: dict[str, Any]
) -> None:
    """4 ranks: 2 replicas of a 2-rank pipeline, AdamW. A rank whose stages train nothing runs no all-reduce
    (counted where the gradient averaging calls torch) and steps an optimizer that holds no parameter."""
    config = _config(
        "adamw", pipe_len=2, virtual=virtual, schedule=schedule, compression="none", microbatches=microbatches
    ).override({"launch.nproc_per_node": 4})
    runs = run_distributed(_train, 4, config, timeout=300)
    run, fixed = runs[0]["result"], reference["adamw"]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in run["epochs"]] == [(0, 2, 2), (1, 2, 2)]
    assert run["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert all(r["result"]["losses"] == run["losses"] for r in runs)
    _check_record(runs, STEPS * 2 * microbatches)  # both replicas
    for rank, r in enumerate(runs):
        for ranges, (steps, reported, ran) in r["syncs"].items():
            assert steps == STEPS and reported == ran  # the code's own count is the calls torch saw
            assert (ran == 0) == (ranges in free), (rank, ranges, ran)
    layouts = [[0, 1, 7], [3, 4, 7]] if virtual == 1 else [[0, 1, 2, 3, 7], [3, 4, 5, 6, 7]]
    _check_optimizers(runs, layouts, (2, 4, 6))


@pytest.mark.distributed
def test_a_stage_of_parameters_the_user_froze_trains_nothing_and_passes_no_gradient(reference: dict[str, Any]) -> None:
    """lin0 frozen by the user (not by the freeze policy): with 2 stages per rank it sits alone on stage 2, after
    flatten and squash, outside the frozen prefix; rank 0 then holds flatten and lin0, nothing to train. The
    stages up to lin0 run without autograd, the one after it receives an input that needs no gradient."""
    config = _config(model={"frozen": ["lin0"]}, pipe_len=2, virtual=2, schedule="interleaved", compression="none")
    (one,) = run_distributed(_train, 1, _config(model={"frozen": ["lin0"]}), timeout=120)
    runs = run_distributed(_train, 2, config, timeout=180)
    run, fixed = runs[0]["result"], one["result"]
    assert run["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert run["losses"] != pytest.approx(reference["sgd"]["losses"], rel=1e-6)  # lin0 did not train
    layouts = [[0, 1, 2, 3, 7], [3, 4, 5, 6, 7]]
    _check_optimizers(runs, layouts, (4, 6))
    assert runs[0]["optimizer_params"][str(layouts[0])] == 0  # flatten and the frozen lin0
    total: dict[str, list[int]] = {}
    for r in runs:
        for name, counts in r["record"].items():
            total[name] = [a + b for a, b in zip(total.get(name, [0, 0, 0]), counts, strict=True)]
    forwards = STEPS * 2
    # tanh0 runs behind the frozen lin0 in the first layout too: no graph there either
    assert total == {
        "flatten": [forwards, 0, 0],
        "squash": [forwards, 0, 0],
        "tanh0": [2 * forwards, 0, 0],
        "tanh1": [2 * forwards, 2 * forwards, 2 * forwards],
    }
