"""The step loop's per-step host shortcuts give what the calls they replace gave (CPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import tiny_vit
from elastic_pipe.data import ElasticSampler
from elastic_pipe.orchestrator.report import step_loss
from elastic_pipe.orchestrator.step_loop import _zero_grad
from elastic_pipe.orchestrator.step_ops import reseed
from elastic_pipe.testing import RankContext, run_distributed, run_tasks


def test_reseed_leaves_the_cpu_generator_as_manual_seed_does() -> None:
    torch.manual_seed(1234)
    expected = torch.rand(5), torch.randn(3), torch.nn.functional.dropout(torch.ones(8), 0.5)
    torch.manual_seed(99)  # another state first: reseed must replace it
    reseed(1234, torch.device("cpu"))
    got = torch.rand(5), torch.randn(3), torch.nn.functional.dropout(torch.ones(8), 0.5)
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b)
    assert torch.default_generator.initial_seed() == 1234


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_one_micro_batch_loss_widens_to_the_float64_mean_of_one(dtype: torch.dtype) -> None:
    loss = torch.tensor(0.1234567, dtype=dtype, requires_grad=True) * 3
    kept = step_loss([loss], torch.zeros((), dtype=torch.float64))
    assert not kept.requires_grad
    old = torch.stack([loss.detach().double()]).mean()
    assert kept.to(torch.float64).item() == old.item()


def test_several_micro_batches_and_none() -> None:
    parts = [torch.tensor(1.0), torch.tensor(2.5), torch.tensor(4.0)]
    assert step_loss(parts, torch.zeros(())).dtype == torch.float64
    assert step_loss(parts, torch.zeros(())).item() == 2.5
    none = torch.zeros((), dtype=torch.float64)
    assert step_loss([], none) is none


def test_zero_grad_sets_the_optimizer_parameters_gradients_to_none() -> None:
    trained, other = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=0.1)
    (trained(torch.ones(1, 3)).sum() + other(torch.ones(1, 3)).sum()).backward()
    _zero_grad(optimizer)()
    assert all(p.grad is None for p in trained.parameters())
    assert all(p.grad is not None for p in other.parameters())  # not the optimizer's: left alone


def test_zero_grad_calls_an_optimizers_own_override() -> None:
    calls: list[bool | None] = []

    class Counting(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True) -> None:
            calls.append(set_to_none)
            super().zero_grad(set_to_none)

    layer = torch.nn.Linear(2, 1)
    _zero_grad(Counting(layer.parameters(), lr=0.1))()
    assert calls == [True]


@pytest.mark.parametrize(("n", "replicas", "batch"), [(10, 1, 4), (11, 2, 4), (7, 3, 6), (5, 4, 8)])
def test_step_indices_are_the_positions_walked_one_by_one(n: int, replicas: int, batch: int) -> None:
    for rank in range(replicas):
        sampler = ElasticSampler(n, replicas, rank, seed=3)
        sampler.set_epoch(2)
        while not sampler.exhausted:
            mine = sampler.positions()[: batch // replicas]
            expected = [int(sampler.epoch_order()[p % n]) for p in mine]  # padding repeats the order's start
            got = sampler.step_indices(batch)
            assert got == expected
            assert all(type(i) is int for i in got)
            sampler.advance(batch)
    assert np.array_equal(np.sort(ElasticSampler(6, 1, 0).step_indices(6)), np.arange(6))


# ------------------------------------------------------------------------------------------------- training
def _train_in_memory(ctx: RankContext, cache: str) -> dict[str, Any]:
    """3 epochs on one rank of samples held in memory, 2 of 3 blocks frozen (and cached) before epoch 1; records
    whether the steps loaded inputs once the cache held every sample, and the losses."""
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split

    config = config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True},
            "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 2}}},
            "pipeline": {"pipe_len": 1, "microbatches": 1, "cache": cache},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )
    gen = torch.Generator().manual_seed(0)
    n = 200
    # sample ids that are not positions: the rows of a miss are found by id
    samples = Split(
        torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen), torch.arange(n) * 7 + 3
    )
    needs: list[bool] = []
    with ElasticTrainer(config, data=samples, quiet=True) as trainer:
        result = trainer.fit(on_epoch_end=lambda t: needs.append(t.prefix.needs_inputs)).to_dict()
        prefix = trainer.prefix
        read: list[float] = []
        if prefix.cache_complete:
            ids = trainer.ctx.host_ids[torch.tensor([5, 0, 17])]
            expected = trainer.ctx.train_set.input_rows(0, len(trainer.ctx.train_set))[torch.tensor([5, 0, 17])]
            read = [float((prefix._read_inputs(ids) - expected).abs().max())]
    return {"losses": result["losses"], "needs_inputs": needs, "read_error": read}


@pytest.mark.distributed
def test_samples_in_memory_load_no_inputs_once_the_cache_holds_them_all() -> None:
    # cache on, then off, in one job (each run has its own samples and trainer)
    tasks = {cache: (_train_in_memory, (cache,)) for cache in ("on", "off")}
    (runs,) = run_distributed(run_tasks, 1, tasks, timeout=480)
    cached, off = runs["on"], runs["off"]
    assert cached["needs_inputs"] == [False, False, False]  # after the transition before epoch 1
    assert off["needs_inputs"] == [True, True, True]
    assert cached["read_error"] == [0.0]  # a miss's inputs, read by sample id
    # float64; the cache's entries come from the fill's batches, the recomputed prefix from the steps': the last
    # bit can differ (as with any cached run), nothing more
    assert cached["losses"] == pytest.approx(off["losses"], rel=1e-12, abs=0)
