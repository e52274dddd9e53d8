"""The Lightning callback: freezes at the policy's rhythm, resumes exactly from the trainer's own checkpoints, keeps
DDP replicas identical. A tiny LightningModule with a block function (the user path of find_blocks), on CPU."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("lightning")

import lightning.pytorch as pl

from elastic_pipe import freeze
from elastic_pipe.integrations import IntegrationError
from elastic_pipe.integrations.lightning import FreezeCallback
from elastic_pipe.testing import RankContext, run_distributed

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning", "ignore::ResourceWarning"
)

BLOCKS, SAMPLES, BATCH = 4, 64, 16


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(BLOCKS)])
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Residual(nn.Sequential):
    """A block whose output is all it passes on (its residual sum inside), as the cache needs."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + super().forward(h)


class IndexedNet(Net):
    """Net with residual blocks, trained on batches ``(x, y, idx)``; its embedding's compute is a layer inside it
    (the cache stubs the units' own modules: a hook on them sees stand-in calls, one on an inner layer real work)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(8, 16))
        self.blocks = nn.ModuleList([Residual(nn.Linear(16, 16), nn.Tanh()) for _ in range(BLOCKS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        return F.cross_entropy(self(x), y)


class CountRows(pl.Callback):
    """Rows through IndexedNet's embedding layer and each block's linear layer, counted by forward hooks."""

    def __init__(self) -> None:
        self.counts = [0] * (BLOCKS + 1)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        modules = [pl_module.embed[0], *(b[0] for b in pl_module.blocks)]  # type: ignore[index, union-attr]
        for i, module in enumerate(modules):
            module.register_forward_hook(functools.partial(self._count, i))

    def _count(self, i: int, _module: nn.Module, args: tuple[torch.Tensor, ...], _output: object) -> None:
        self.counts[i] += args[0].shape[0]


def net_blocks(module: nn.Module) -> list[Any]:
    return [[module.embed, module.blocks[0]], *module.blocks[1:]]  # type: ignore[index]


def data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def fit(
    root: Path,
    callback: FreezeCallback,
    *,
    epochs: int = 3,
    ckpt: str | None = None,
    extra: list[pl.Callback] | None = None,
    net: type[Net] = Net,
    **options: Any,
) -> tuple[pl.Trainer, Net]:
    pl.seed_everything(0, verbose=False)
    model = net()
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=root, every_n_epochs=1, save_top_k=-1, save_last=False)
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[callback, checkpoints, *(extra or [])],
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        **options,
    )
    # a fixed order: Lightning does not restore the global RNG a shuffling sampler draws from
    train = data()
    if issubclass(net, IndexedNet):
        train = torch.utils.data.TensorDataset(*train.tensors, torch.arange(SAMPLES))
    loader = torch.utils.data.DataLoader(train, batch_size=BATCH)
    trainer.fit(model, loader, torch.utils.data.DataLoader(data(), batch_size=SAMPLES), ckpt_path=ckpt)
    return trainer, model


def test_a_schedule_freezes_at_its_epochs_and_logs_it(tmp_path: Path) -> None:
    callback = FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: 2, 2: 3}), blocks=net_blocks)
    trainer, model = fit(tmp_path, callback, devices=1)
    per_epoch = SAMPLES // BATCH
    assert callback.controller.every == per_epoch
    assert [(e["step"], e["frozen"]) for e in callback.controller.events] == [(per_epoch, 2), (2 * per_epoch, 3)]
    assert not model.embed.weight.requires_grad and not model.blocks[2][0].weight.requires_grad
    assert model.blocks[3][0].weight.requires_grad
    held = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    assert float(trainer.callback_metrics["frozen_blocks"]) == 3.0


def test_resume_from_the_trainers_checkpoint_continues_exactly(tmp_path: Path) -> None:
    def policy(units: int, total: int) -> freeze.FreezePolicy:
        return freeze.Drift(units, total_steps=total, settle_after=0.3)

    full = FreezeCallback(policy, blocks=net_blocks)
    _, model = fit(tmp_path / "full", full, epochs=4, devices=1)
    assert full.controller.events, "the drift policy should freeze in this run"
    for ckpt in sorted((tmp_path / "full").glob("epoch=*.ckpt"))[:3]:
        resumed = FreezeCallback(policy, blocks=net_blocks)
        _, again = fit(tmp_path / ckpt.stem, resumed, epochs=4, devices=1, ckpt=str(ckpt))
        assert resumed.frozen == full.frozen
        assert resumed.controller.events == full.controller.events
        assert resumed.controller.policy.state_dict() == full.controller.policy.state_dict()  # type: ignore[union-attr]
        for (name, a), b in zip(model.named_parameters(), again.parameters(), strict=True):
            assert torch.equal(a, b), f"{name} differs after resuming from {ckpt.name}"


def test_the_cache_runs_the_frozen_prefix_once_per_sample_and_resumes_exactly(tmp_path: Path) -> None:
    runs = {}
    for cache in (False, True):
        callback = FreezeCallback(
            freeze.ManualSchedule(BLOCKS, {1: 2}), blocks=net_blocks, cache=cache, index_key=2
        )  # batches (x, y, idx): the index at position 2
        count = CountRows()
        _, model = fit(tmp_path / str(cache), callback, net=IndexedNet, extra=[count], devices=1)
        runs[cache] = (count.counts, model, callback)
    (plain, model, _), (cached, cached_model, callback) = runs[False], runs[True]
    # 3 epochs, each with a validation of every sample; 2 of 4 blocks frozen after the first epoch: with the cache
    # the embedding and the frozen blocks train on each sample once in epoch 0 and once in the 2 epochs after it
    validated = 3 * SAMPLES
    assert plain == [3 * SAMPLES + validated] * (BLOCKS + 1)
    assert cached == [2 * SAMPLES + validated] * 3 + [3 * SAMPLES + validated + 2 * BATCH] * 2  # + the check
    assert callback.cache is not None and callback.cache.filled == SAMPLES
    for (name, a), b in zip(model.named_parameters(), cached_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=f"{name} differs with the cache")
    ckpt = tmp_path / "True" / "epoch=1-step=8.ckpt"  # after the freeze: the resumed run fills the cache again
    resumed = FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: 2}), blocks=net_blocks, cache=True, index_key=2)
    _, again = fit(tmp_path / "again", resumed, net=IndexedNet, ckpt=str(ckpt), devices=1)
    assert resumed.cache is not None and resumed.cache.filled == SAMPLES
    for (name, a), b in zip(cached_model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resuming from {ckpt.name} with the cache"


def test_a_freeze_is_carried_by_the_steps_served_from_the_boundary_before_it(tmp_path: Path) -> None:
    callback = FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: 1, 2: 3}), blocks=net_blocks, cache=True, index_key=2)
    count = CountRows()
    _, model = fit(tmp_path / "carried", callback, net=IndexedNet, extra=[count], epochs=4, devices=1)
    plain = FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: 1, 2: 3}), blocks=net_blocks, index_key=2)
    _, plain_model = fit(tmp_path / "plain", plain, net=IndexedNet, epochs=4, devices=1)
    s, b, validated = SAMPLES, BATCH, 4 * SAMPLES
    # epoch 1 fills boundary 1 (the embedding and block 0); epoch 2 is served from it, runs blocks 1-2 once per
    # sample and stores boundary 3 on the way (the embedding and block 0 do not train there); epoch 3 reads
    # boundary 3 after one checked fill
    expected = [2 * s + b] * 2 + [3 * s + 3 * b] * 2 + [4 * s + 4 * b]
    assert count.counts == [n + validated for n in expected]
    assert callback.cache is not None and callback.cache.filled == s + b and callback.cache.carried == s
    for (name, a), c in zip(plain_model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, c, msg=f"{name} differs with the carried cache")


class CountCalls(pl.Callback):
    """Calls of the LightningModule (its forward pre-hooks): training steps, validations and any fill's own."""

    def __init__(self) -> None:
        self.calls = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.register_forward_pre_hook(self._count)

    def _count(self, *_: object) -> None:
        self.calls += 1


def test_a_fill_stores_the_boundary_in_the_steps_own_forward(tmp_path: Path) -> None:
    callback = FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: 2}), blocks=net_blocks, cache=True, index_key=2)
    count = CountCalls()
    fit(tmp_path, callback, net=IndexedNet, extra=[count], devices=1)
    steps, validations = 3 * SAMPLES // BATCH, 3
    # epoch 1 fills boundary 2 in its steps' own forwards: only the boundary's first fill calls the module twice
    # more (its forward, and again served from what it stored: the check)
    assert count.calls == steps + validations + 2
    assert callback.cache is not None and callback.cache.filled == SAMPLES


class ResidualOutside(IndexedNet):
    """IndexedNet summing each block's output into the stream outside the block, as Net does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Net.forward(self, x)


def test_the_cache_refuses_a_model_that_passes_on_more_than_a_blocks_output(tmp_path: Path) -> None:
    callback = FreezeCallback(freeze.ManualSchedule(BLOCKS, {1: 2}), blocks=net_blocks, cache=True, index_key=2)
    with pytest.raises(IntegrationError, match="residual"):
        fit(tmp_path, callback, net=ResidualOutside, devices=1)


def _ddp_rank(ctx: RankContext, root: str, indexed: bool = False, cache: bool = False) -> dict[str, Any]:
    os.environ.update(
        RANK=str(ctx.rank),
        LOCAL_RANK=str(ctx.rank),
        WORLD_SIZE=str(ctx.world_size),
        LOCAL_WORLD_SIZE=str(ctx.world_size),
        GROUP_RANK="0",
        MASTER_ADDR=ctx.master_addr,
        MASTER_PORT=str(ctx.master_port),
        TORCHELASTIC_RUN_ID="elastic-pipe-test",
    )
    from lightning.pytorch.strategies import DDPStrategy
    from torch.nn.parallel import DistributedDataParallel

    from elastic_pipe.integrations import reduced_parameters

    # 2 steps per epoch and rank; decisions after steps 1, 2, 3, ... (epochs 0, 1, 1, 2, 2)
    callback = FreezeCallback(
        freeze.ManualSchedule(BLOCKS, {1: 2, 2: 3}), blocks=net_blocks, decide_every=1, cache=cache, index_key=2
    )
    seen: dict[str, Any] = {}

    class Inspect(pl.Callback):  # the strategy unwraps the model at teardown: look while it is wrapped
        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            ddp = trainer.strategy.model
            assert isinstance(ddp, DistributedDataParallel), type(ddp)
            reduced = {id(p) for p in reduced_parameters(ddp)}
            seen["reduced_equals_trainable"] = reduced == {id(p) for p in pl_module.parameters() if p.requires_grad}
            seen["find_unused"] = ddp.find_unused_parameters

    strategy = DDPStrategy(process_group_backend="gloo", find_unused_parameters=True)  # the callback turns it off
    net = IndexedNet if indexed else Net
    _, model = fit(Path(root), callback, devices=2, strategy=strategy, extra=[Inspect()], net=net)
    return {
        **seen,
        "events": [(e["step"], e["frozen"]) for e in callback.controller.events],
        "params": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
        "cached": None if callback.cache is None else callback.cache.filled,
    }


@pytest.mark.distributed
@pytest.mark.slow  # two spawned ranks importing the trainer: 20-30 s on the shared 2-core machine
def test_ddp_replicas_stay_identical_and_frozen_blocks_are_not_reduced(tmp_path: Path) -> None:
    results = run_distributed(_ddp_rank, 2, str(tmp_path), timeout=240.0)
    assert [r["events"] for r in results] == [[(2, 2), (4, 3)]] * 2
    assert all(r["reduced_equals_trainable"] for r in results)
    assert [r["find_unused"] for r in results] == [False, False]
    assert results[0]["params"] == results[1]["params"]  # bit-identical replicas


@pytest.mark.distributed
@pytest.mark.slow  # as above, twice
def test_ddp_with_the_cache_fills_each_ranks_share_and_keeps_replicas_identical(tmp_path: Path) -> None:
    plain = run_distributed(_ddp_rank, 2, str(tmp_path / "plain"), True, False, timeout=240.0)
    cached = run_distributed(_ddp_rank, 2, str(tmp_path / "cached"), True, True, timeout=240.0)
    assert [r["events"] for r in cached] == [r["events"] for r in plain] == [[(2, 2), (4, 3)]] * 2
    assert all(r["reduced_equals_trainable"] for r in cached)
    assert [r["find_unused"] for r in cached] == [False, False]
    assert cached[0]["params"] == cached[1]["params"]  # bit-identical replicas with the cache too
    # each rank reads half the samples an epoch; the boundary after 2 units (frozen after epoch 0) is filled over
    # epoch 1 and the one after 3 units over epoch 2, each with the rank's own half only, nothing twice
    assert [r["cached"] for r in cached] == [2 * (SAMPLES // 2)] * 2
    # the cached boundary serves what the frozen blocks computed: the same training as without the cache
    torch.testing.assert_close(torch.tensor(cached[0]["params"]), torch.tensor(plain[0]["params"]))
