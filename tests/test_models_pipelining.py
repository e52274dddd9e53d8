"""Any contiguous slice of a SubLayerModel runs as a torch.distributed.pipelining stage.

Two gloo processes hold the two halves of a model; a GPipe step must give the loss and the gradients of the same
step on the whole model in one process (float64).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from elastic_pipe.models import SubLayerModel, bert_encoder, vit
from elastic_pipe.testing import RankContext, run_distributed

MICROBATCHES = 2


def _model(kind: str) -> SubLayerModel:
    if kind == "vit":
        return vit("vit-tiny", depth=2, dtype=torch.float64, seed=3)
    return bert_encoder("bert-tiny", dtype=torch.float64, seed=3)


def _batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    if kind == "vit":
        return torch.randn(4, 1, 8, 8, dtype=torch.float64, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    ids = torch.randint(1, 128, (4, 9), generator=gen)
    ids[1, 5:] = 0  # padding travels as the mask channel across the cut
    return ids, torch.randint(0, 2, (4,), generator=gen)


CASES = (("vit", 2), ("bert", 3))  # (model, cut): cut inside block 0 for the ViT, between blocks for BERT


def _pipeline_steps(ctx: RankContext) -> list[dict[str, Any]]:
    # Both models in the same two processes: spawning processes is the expensive part of this test.
    return [_pipeline_step(ctx, kind, cut) for kind, cut in CASES]


def _pipeline_step(ctx: RankContext, kind: str, cut: int) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    model = _model(kind)
    inputs, labels = _batch(kind)
    part = model.slice(0, cut) if ctx.rank == 0 else model.slice(cut, model.num_sublayers)
    stage = PipelineStage(part, ctx.rank, ctx.world_size, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=F.cross_entropy)
    losses: list[torch.Tensor] = []
    if ctx.rank == 0:
        schedule.step(inputs)
    else:
        schedule.step(target=labels, losses=losses)
    # Plain lists cross the process boundary safely (tensors would share memory with an exiting process).
    grads = {name: p.grad.tolist() for name, p in part.named_parameters() if p.grad is not None}
    return {"loss": float(torch.stack(losses).mean().detach()) if losses else None, "grads": grads}


@pytest.mark.distributed
def test_two_stage_gpipe_matches_single_process() -> None:
    results = run_distributed(_pipeline_steps, 2, timeout=120)
    for case, (kind, cut) in enumerate(CASES):
        _check(kind, cut, results[0][case], results[1][case])


def _check(kind: str, cut: int, rank0: dict[str, Any], rank1: dict[str, Any]) -> None:
    model = _model(kind)
    inputs, labels = _batch(kind)
    # GPipe averages the micro-batch losses' gradients: the same as the mean loss over equal micro-batches.
    losses = [
        F.cross_entropy(model(x), y)
        for x, y in zip(inputs.chunk(MICROBATCHES), labels.chunk(MICROBATCHES), strict=True)
    ]
    loss = torch.stack(losses).mean()
    loss.backward()
    assert rank1["loss"] == pytest.approx(loss.item(), abs=1e-12)
    reference = [
        dict(model.slice(0, cut).named_parameters()),
        dict(model.slice(cut, model.num_sublayers).named_parameters()),
    ]
    for got, ref in zip((rank0["grads"], rank1["grads"]), reference, strict=True):
        assert set(got) == {n for n, p in ref.items() if p.grad is not None}
        for name, grad in got.items():
            torch.testing.assert_close(torch.tensor(grad, dtype=torch.float64), ref[name].grad, rtol=0, atol=1e-12)
