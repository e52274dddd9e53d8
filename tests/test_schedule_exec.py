"""Real execution on torch.distributed.pipelining over gloo: pipelined gradients equal the unpipelined model's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from elastic_pipe.schedule import GENERATORS, ScheduleError, generate
from elastic_pipe.testing import RankContext, run_distributed

_WIDTH = 6
_BATCH = 48
_TOLERANCE = 1e-12


def _model(num_stages: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(_WIDTH, _WIDTH), nn.Tanh()) for _ in range(num_stages))).double()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(_BATCH, _WIDTH, generator=gen, dtype=torch.float64)
    y = torch.randn(_BATCH, _WIDTH, generator=gen, dtype=torch.float64)
    return x, y


def _cases(world: int) -> list[tuple[str, int, int]]:
    """(kind, microbatches, chunks) per generator, sized for ``world`` ranks."""
    return [("gpipe", 4, 1), ("1f1b", 4, 1), ("zb1p", 4, 1), ("interleaved", 2 * world, 2), ("gpipe", 4, 2)]


def _run_all(ctx: RankContext) -> dict[str, float]:
    from torch.distributed.pipelining import PipelineStage

    from elastic_pipe.schedule import torch_schedule

    errors: dict[str, float] = {}
    x, y = _data()
    for kind, mbs, chunks in _cases(ctx.world_size):
        schedule = generate(kind, ctx.world_size, mbs, chunks)
        reference = _model(schedule.num_stages)
        nn.functional.mse_loss(reference(x), y).backward()
        model = _model(schedule.num_stages)
        stages = [
            PipelineStage(model[s], s, schedule.num_stages, torch.device("cpu")) for s in schedule.stages_of(ctx.rank)
        ]
        runner = torch_schedule(schedule, ctx.rank, stages, nn.functional.mse_loss)
        losses: list[torch.Tensor] = []
        holds_first = 0 in schedule.stages_of(ctx.rank)
        holds_last = schedule.num_stages - 1 in schedule.stages_of(ctx.rank)
        runner.step(*((x,) if holds_first else ()), target=y if holds_last else None, losses=losses)
        worst = 0.0
        for s in schedule.stages_of(ctx.rank):
            for got, want in zip(model[s].parameters(), reference[s].parameters(), strict=True):
                assert got.grad is not None, f"{kind}: stage {s} got no gradient"
                worst = max(worst, (got.grad - want.grad).abs().max().item())
        if holds_last:
            mean_loss = torch.stack(losses).mean().item()
            worst = max(worst, abs(mean_loss - nn.functional.mse_loss(reference(x), y).item()))
        errors[f"{kind}/v{chunks}"] = worst
    return errors


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_every_generator_matches_unpipelined_gradients(world: int) -> None:
    results = run_distributed(_run_all, world, timeout=120)
    assert {k for r in results for k in r} == {f"{k}/v{v}" for k, _, v in _cases(world)}
    assert {k for k, _, _ in _cases(world)} == set(GENERATORS)
    for rank, errors in enumerate(results):
        for case, error in errors.items():
            assert error <= _TOLERANCE, f"rank {rank} {case}: max gradient difference {error}"


def test_stage_mismatch_is_refused() -> None:
    from elastic_pipe.schedule import torch_schedule

    schedule = generate("1f1b", 2, 2)

    class FakeStage:
        stage_index = 1
        num_stages = 2
        group_size = 2

    with pytest.raises(ScheduleError, match=r"holds stages \[1\] but the schedule places stages \[0\]"):
        torch_schedule(schedule, 0, [FakeStage()], nn.functional.mse_loss)


def test_torch_actions_round_trip_through_torch_text_form() -> None:
    from elastic_pipe.schedule import torch_actions

    schedule = generate("zb1p", 2, 2)
    lowered = torch_actions(schedule)
    assert {r: [str(a) for a in acts] for r, acts in lowered.items()} == {
        int(r): acts for r, acts in schedule.to_text().items()
    }
