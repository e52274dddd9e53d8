"""The Hugging Face Trainer callback: freezes at the policy's rhythm, resumes exactly, keeps DDP replicas identical.

Tiny BERTs built from a config (no downloads), on CPU."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

from elastic_pipe import freeze
from elastic_pipe.integrations import IntegrationError
from elastic_pipe.integrations.transformers import PROBE_FILE, STATE_FILE, FreezeCallback
from elastic_pipe.testing import RankContext, run_distributed
from script_module import load_script

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

LAYERS, SEQ, SAMPLES, BATCH = 4, 8, 48, 8


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences labelled by their first token (learnable, fixed by the seed)."""

    def __init__(self, n: int = SAMPLES) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, SEQ), generator=g)
        self.labels = (self.ids[:, 0] >= 50).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": self.labels[i]}


class Indexed(Tokens):
    """The same samples, each with its position under ``idx`` (what the cache keys on)."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {**super().__getitem__(i), "idx": torch.tensor(i)}


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def arguments(out: Path, **overrides: Any) -> TrainingArguments:
    options: dict[str, Any] = {
        "output_dir": str(out),
        "per_device_train_batch_size": BATCH,
        "num_train_epochs": 3,
        "learning_rate": 3e-3,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 6,
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    options.update(overrides)
    return TrainingArguments(**options)


def drift_policy(units: int, total: int) -> freeze.FreezePolicy:
    # settle from 30% of the run on, so that this short run freezes in its middle and resumes cross a freeze
    return freeze.Drift(units, total_steps=total, settle_after=0.3)


def test_a_schedule_freezes_at_its_epochs_and_the_optimizer_keeps_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_bert()
    callback = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 2, 2: 3}))
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=Tokens(), callbacks=[callback])
    trainer.train()
    per_epoch = SAMPLES // BATCH
    assert callback.controller.every == per_epoch  # a schedule decides once per epoch
    assert [(e["step"], e["frozen"]) for e in callback.controller.events] == [(per_epoch, 2), (2 * per_epoch, 3)]
    frozen = [m for unit in callback.controller.blocks.units[:3] for m in unit]  # type: ignore[union-attr]
    frozen_ids = {id(p) for m in frozen for p in m.parameters()}
    held = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert frozen_ids and not frozen_ids & {id(p) for p in held}
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    # the embeddings froze with the first block; the 4th block and the head still train, with optimizer state
    assert not model.bert.embeddings.word_embeddings.weight.requires_grad
    assert model.bert.encoder.layer[3].output.dense.weight.requires_grad
    assert all(p in trainer.optimizer.state for p in held)
    logged = [e for e in trainer.state.log_history if "freeze/frozen_blocks" in e]
    assert [(e["step"], e["freeze/frozen_blocks"]) for e in logged] == [(per_epoch, 2), (2 * per_epoch, 3)]
    assert "'frozen_blocks': 3" in capsys.readouterr().out  # the printer, after this callback, shows the count


def _run(
    out: Path, resume: str | None = None, resume_from: Path | None = None, *, cache: bool = False
) -> tuple[FreezeCallback, Trainer]:
    model = tiny_bert()
    callback = FreezeCallback(drift_policy, resume_from=resume_from, cache=cache)
    args = arguments(out, save_strategy="steps", save_steps=4, remove_unused_columns=not cache)
    data = Indexed() if cache else Tokens()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train(resume_from_checkpoint=resume)
    return callback, trainer


def test_resume_from_a_checkpoint_continues_exactly(tmp_path: Path) -> None:
    full, trainer = _run(tmp_path / "full")
    events = full.controller.events
    assert events, "the drift policy should freeze in this run"
    first = events[0]["step"]
    # a checkpoint before the first freeze and one after it
    steps = sorted({4 * (first // 4), 4 * (first // 4 + 1)} - {0})
    for step in steps:
        ckpt = tmp_path / "full" / f"checkpoint-{step}"
        saved = json.loads((ckpt / STATE_FILE).read_text())
        assert (ckpt / PROBE_FILE).is_file()
        assert saved["frozen"] == max([0] + [e["frozen"] for e in events if e["step"] <= step])
        if step == steps[0]:  # the checkpoint named to the callback
            resumed, again = _run(tmp_path / f"from{step}", resume=str(ckpt), resume_from=ckpt)
        else:  # the checkpoint in the output directory (what resume_from_checkpoint=True picks), found by itself
            shutil.copytree(ckpt, tmp_path / f"from{step}" / ckpt.name)
            resumed, again = _run(tmp_path / f"from{step}", resume=str(tmp_path / f"from{step}" / ckpt.name))
        assert resumed.frozen == full.frozen
        assert resumed.controller.events == events
        assert resumed.controller.policy.state_dict() == full.controller.policy.state_dict()  # type: ignore[union-attr]
        for (name, a), b in zip(trainer.model.named_parameters(), again.model.parameters(), strict=True):
            assert torch.equal(a, b), f"{name} differs after resuming from step {step}"


def test_resume_without_the_callbacks_state_names_the_file(tmp_path: Path) -> None:
    args = arguments(tmp_path / "a", save_strategy="steps", save_steps=6, max_steps=6)
    Trainer(model=tiny_bert(), args=args, train_dataset=Tokens()).train()
    trainer = Trainer(
        model=tiny_bert(), args=arguments(tmp_path / "a"), train_dataset=Tokens(), callbacks=[FreezeCallback()]
    )
    with pytest.raises(IntegrationError, match=STATE_FILE):
        trainer.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-6"))


def _count_rows(model: BertForSequenceClassification) -> list[int]:
    """Rows through the embeddings and each block's first linear layer, counted by forward hooks as they run."""
    counts = [0] * (LAYERS + 1)
    modules = [model.bert.embeddings.word_embeddings, *(b.attention.self.query for b in model.bert.encoder.layer)]
    for i, module in enumerate(modules):

        def count(_m: torch.nn.Module, args: tuple[torch.Tensor, ...], _out: object, i: int = i) -> None:
            counts[i] += args[0].shape[0]

        module.register_forward_hook(count)
    return counts


def test_the_cache_runs_the_frozen_prefix_once_per_sample_to_the_same_weights(tmp_path: Path) -> None:
    runs = {}
    for cache in (False, True):
        model = tiny_bert()
        counts = _count_rows(model)
        callback = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 2}), cache=cache)
        args = arguments(tmp_path / str(cache), remove_unused_columns=False)  # keeps idx (unused without cache)
        Trainer(model=model, args=args, train_dataset=Indexed(), callbacks=[callback]).train()
        runs[cache] = (counts, model, callback)
    (plain, model, _), (cached, cached_model, callback) = runs[False], runs[True]
    # 3 epochs, 2 of 4 blocks frozen after the first: without the cache everything runs every epoch; with it the
    # embeddings and the 2 frozen blocks run each sample once in epoch 0 (training) and once in all later epochs
    # (the boundary's first fill also runs the blocks after it on its batch twice, through the frozen blocks and
    # served from their outputs, to check the two agree)
    assert plain == [3 * SAMPLES] * (LAYERS + 1)
    assert cached == [2 * SAMPLES] * 3 + [3 * SAMPLES + 2 * BATCH] * 2
    assert callback.cache is not None and callback.cache.filled == SAMPLES
    for (name, a), b in zip(model.named_parameters(), cached_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=f"{name} differs with the cache")
    assert model.bert.encoder.layer[0].forward.__self__ is model.bert.encoder.layer[0]  # stubs taken off at the end


class HeldBoundaries(TrainerCallback):
    """The boundaries a callback's cache holds entries of, at each epoch's end."""

    def __init__(self, callback: FreezeCallback) -> None:
        self.callback, self.held = callback, list[list[int]]()

    def on_epoch_end(self, *args: Any, **kwargs: Any) -> None:
        cache = self.callback.cache
        self.held.append([] if cache is None or cache.cache is None else cache.cache.boundaries())


def test_a_freeze_is_carried_by_the_steps_served_from_the_boundary_before_it(tmp_path: Path) -> None:
    runs = {}
    for cache in (False, True):
        model = tiny_bert()
        counts = _count_rows(model)
        callback = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 1, 2: 3}), cache=cache)
        held = HeldBoundaries(callback)
        args = arguments(tmp_path / str(cache), remove_unused_columns=False, num_train_epochs=4)
        Trainer(model=model, args=args, train_dataset=Indexed(), callbacks=[callback, held]).train()
        runs[cache] = (counts, model, callback, held.held)
    (_, model, _, _), (cached, cached_model, callback, held) = runs[False], runs[True]
    s, b = SAMPLES, BATCH
    # epoch 0 trains everything; epoch 1 fills boundary 1 (the embeddings and block 0; its first batch also runs
    # the blocks after it twice, the check); epoch 2 is served from boundary 1 and runs blocks 1-2 once per sample
    # on the way, storing boundary 3 (no fill: the embeddings and block 0 do not run); epoch 3 reads boundary 3,
    # its first batch filled again to check the new boundary's served path
    assert cached == [2 * s + b] * 2 + [3 * s + 3 * b] * 2 + [4 * s + 4 * b]
    assert callback.cache is not None and callback.cache.filled == s + b and callback.cache.carried == s
    assert held == [[], [1], [3], [3]]  # boundary 1 let go once boundary 3 held every sample
    for (name, a), c in zip(model.named_parameters(), cached_model.parameters(), strict=True):
        torch.testing.assert_close(a, c, msg=f"{name} differs with the carried cache")


def test_a_resume_inside_the_carried_epoch_fills_instead_and_ends_with_the_same_weights(tmp_path: Path) -> None:
    def run(out: Path, resume: Path | None = None) -> tuple[FreezeCallback, Trainer]:
        callback = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 1, 2: 3}), cache=True, resume_from=resume)
        args = arguments(out, save_strategy="steps", save_steps=3, remove_unused_columns=False, num_train_epochs=4)
        trainer = Trainer(model=tiny_bert(), args=args, train_dataset=Indexed(), callbacks=[callback])
        trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
        return callback, trainer

    full, trainer = run(tmp_path / "full")
    assert full.cache is not None and full.cache.carried == SAMPLES
    step = 2 * SAMPLES // BATCH + 3  # half-way through epoch 2, the epoch that carries boundary 1 to boundary 3
    resumed, again = run(tmp_path / "again", tmp_path / "full" / f"checkpoint-{step}")
    assert resumed.cache is not None and resumed.cache.carried == 0  # the cache is not saved: the resume fills
    for (name, a), b in zip(trainer.model.named_parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resuming from step {step} inside the carried epoch"


class FreezeTwoAtStep3(freeze.Policy):
    """Freezes 2 blocks at the first decision point from step 3 on: half-way through the first epoch."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        del epoch
        return max(current, 2) if step >= 3 else current


def test_a_batch_with_any_miss_fills_at_its_full_size(tmp_path: Path) -> None:
    model = tiny_bert()
    sizes: list[int] = []  # rows per forward through block 0 (training before the freeze, fills after)
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda _m, args, _out: sizes.append(args[0].shape[0])
    )
    callback = FreezeCallback(FreezeTwoAtStep3(LAYERS), decide_every=1, cache=True)
    args = arguments(tmp_path, remove_unused_columns=False)
    Trainer(model=model, args=args, train_dataset=Indexed(), callbacks=[callback]).train()
    assert [e["step"] for e in callback.controller.events] == [3]
    # the rest of epoch 0 fills half the samples; epoch 1's shuffled batches mix hits and misses, and each of those
    # runs whole: no forward of another size, and more rows than samples computed (the mixed batches' hits again)
    assert sizes and set(sizes) == {BATCH}
    assert callback.cache is not None and SAMPLES < callback.cache.filled < 2 * SAMPLES
    assert callback.cache.filled % BATCH == 0


def test_a_fill_stores_the_boundary_in_the_steps_own_forward(tmp_path: Path) -> None:
    model = tiny_bert()
    calls = [0]  # forwards of the whole model: the training steps', and any a fill runs of its own
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    callback = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 2}), cache=True)
    args = arguments(tmp_path, remove_unused_columns=False)
    Trainer(model=model, args=args, train_dataset=Indexed(), callbacks=[callback]).train()
    steps = 3 * SAMPLES // BATCH
    # epoch 1 fills boundary 2 in its steps' own forwards; only the boundary's first fill runs the model twice more
    # (its forward, and again served from what it stored: the check), and epoch 2 is served
    assert calls[0] == steps + 2
    assert callback.cache is not None and callback.cache.filled == SAMPLES and callback.cache.carried == 0


def test_a_served_step_dispatches_fewer_operations_than_freezing_without_the_cache(tmp_path: Path) -> None:
    script = load_script(Path("benchmarks/hf_callback_ops.py"))
    ops = {}
    for arm in ("none", "nocache", "cache"):
        count = script.OpsPerStep()  # benchmarks/hf_callback_ops.py's counter, at a tiny size
        callbacks: list[TrainerCallback] = [count]
        if arm != "none":
            callbacks.insert(0, FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 3}), cache=arm == "cache"))
        args = arguments(tmp_path / arm, remove_unused_columns=False)
        data = Indexed() if arm == "cache" else Tokens()
        Trainer(model=tiny_bert(), args=args, train_dataset=data, callbacks=callbacks).train()
        ops[arm] = count.by_epoch(3)
    # host work, which is what a host-bound step on a GPU pays: 3 of 4 blocks frozen after epoch 0; without the
    # cache they still run forward; epoch 1 fills in its steps' own forwards (its first step also checks the
    # served path), epoch 2 is served and dispatches none of their work
    full, nocache = max(ops["none"]["2"]), max(ops["nocache"]["2"])
    filled, served = ops["cache"]["1"][1:], ops["cache"]["2"]
    assert max(served) < nocache < full
    assert max(filled) < full and len(set(served)) == 1
    assert max(served) < 0.6 * full


class FreezeOneThenTwo(freeze.Policy):
    """Freezes 1 block from step 3 and 2 from step 9: both freezes half-way through an epoch."""

    def propose(self, epoch: int, step: int, current: int) -> int:
        del epoch
        return max(current, 2 if step >= 9 else 1 if step >= 3 else 0)


class OlderHoldsTheNewer(TrainerCallback):
    """After each step while a freeze is carried: every sample the new boundary holds, the older one holds too."""

    def __init__(self, callback: FreezeCallback) -> None:
        self.callback, self.checked, self.held = callback, 0, list[list[int]]()

    def on_epoch_end(self, *args: Any, **kwargs: Any) -> None:
        cache = self.callback.cache
        self.held.append([] if cache is None or cache.cache is None else cache.cache.boundaries())

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        cache = self.callback.cache
        if cache is None or cache.cache is None or not cache._older:
            return
        every = torch.arange(SAMPLES)
        newer, older = cache.cache.cached(every, cache.boundary), cache.cache.cached(every, cache._older)
        assert bool(older[newer].all()), f"samples at boundary {cache.boundary} missing at {cache._older}"
        self.checked += 1


def test_a_fill_while_a_freeze_is_carried_also_stores_the_boundary_before_it(tmp_path: Path) -> None:
    model = tiny_bert()
    callback = FreezeCallback(FreezeOneThenTwo(LAYERS), decide_every=1, cache=True)
    check = OlderHoldsTheNewer(callback)
    args = arguments(tmp_path, remove_unused_columns=False, num_train_epochs=4)
    Trainer(model=model, args=args, train_dataset=Indexed(), callbacks=[callback, check]).train()
    assert [(e["step"], e["frozen"]) for e in callback.controller.events] == [(3, 1), (9, 2)]
    cache = callback.cache
    assert cache is not None and check.checked > 0  # boundary 1 was kept while boundary 2 filled
    # boundary 2 was filled and carried until it held every sample, then boundary 1 was let go
    assert cache.carried > 0 and check.held == [[1], [1, 2], [2], [2]]


class BadIndexAfterTheFreeze(TrainerCallback):
    """Right after the freeze to 2 blocks (boundary 1 kept, boundary 2 not yet checked): prepares a batch whose
    index lies outside the training set, and keeps what it raised."""

    def __init__(self, callback: FreezeCallback) -> None:
        self.callback = callback
        self.state: tuple[int, int, bool] | None = None
        self.raised: BaseException | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        cache = self.callback.cache
        if state.global_step != 9 or cache is None:
            return
        self.state = (cache.boundary, cache._older, cache.boundary in cache._verified)
        try:
            cache.prepare(torch.tensor([0, SAMPLES + 7]), lambda: None)
        except Exception as exc:  # the test reads its type
            self.raised = exc
        finally:
            cache.release()


def test_a_batch_index_outside_the_training_set_right_after_a_freeze_is_named_by_the_callback(
    tmp_path: Path,
) -> None:
    callback = FreezeCallback(FreezeOneThenTwo(LAYERS), decide_every=1, cache=True)
    probe = BadIndexAfterTheFreeze(callback)
    args = arguments(tmp_path, remove_unused_columns=False, num_train_epochs=2)
    Trainer(model=tiny_bert(), args=args, train_dataset=Indexed(), callbacks=[callback, probe]).train()
    assert probe.state == (2, 1, False)  # the lookup at the kept boundary is the one that reads the index
    assert isinstance(probe.raised, IntegrationError), repr(probe.raised)
    assert "idx" in str(probe.raised) and f"{SAMPLES + 7}" in str(probe.raised)


def test_the_cache_refuses_random_augmentation_unless_views_and_batches_without_the_index(tmp_path: Path) -> None:
    with pytest.raises(IntegrationError, match="cache_views=V"):
        FreezeCallback(cache=True, augmentation="random")
    # views on purpose: 2 per sample, epoch e reads view e % 2; frozen after epoch 0, epochs 1 and 2 fill a view each
    views = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 2}), cache=True, augmentation="random", cache_views=2)
    args = arguments(tmp_path / "views", remove_unused_columns=False, num_train_epochs=4)
    Trainer(model=tiny_bert(), args=args, train_dataset=Indexed(), callbacks=[views]).train()
    assert views.cache is not None and views.cache.filled == 2 * SAMPLES  # epoch 3 read epoch 1's view

    class RandomHorizontalFlip:  # a random transform the data did not declare
        pass

    flipped = Indexed()
    flipped.transform = RandomHorizontalFlip()  # type: ignore[attr-defined]
    args = arguments(tmp_path / "flipped", remove_unused_columns=False)
    trainer = Trainer(model=tiny_bert(), args=args, train_dataset=flipped, callbacks=[FreezeCallback(cache=True)])
    with pytest.raises(IntegrationError, match="RandomHorizontalFlip"):
        trainer.train()
    trainer = Trainer(
        model=tiny_bert(), args=arguments(tmp_path), train_dataset=Indexed(), callbacks=[FreezeCallback(cache=True)]
    )  # remove_unused_columns drops idx before the batches reach the model
    with pytest.raises(IntegrationError, match="remove_unused_columns=False"):
        trainer.train()


def test_resume_with_the_cache_continues_exactly(tmp_path: Path) -> None:
    full, trainer = _run(tmp_path / "full", cache=True)
    assert full.controller.events, "the drift policy should freeze in this run"
    step = 4 * (full.controller.events[0]["step"] // 4 + 1)  # the first checkpoint after the first freeze
    ckpt = tmp_path / "full" / f"checkpoint-{step}"
    resumed, again = _run(tmp_path / "again", resume=str(ckpt), resume_from=ckpt, cache=True)
    assert resumed.controller.events == full.controller.events
    for (name, a), b in zip(trainer.model.named_parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resuming from step {step} with the cache"


def _ddp_rank(ctx: RankContext, out: str, cache: bool = False) -> dict[str, Any]:
    os.environ.update(
        RANK=str(ctx.rank),
        LOCAL_RANK=str(ctx.rank),
        WORLD_SIZE=str(ctx.world_size),
        LOCAL_WORLD_SIZE=str(ctx.world_size),
        MASTER_ADDR=ctx.master_addr,
        MASTER_PORT=str(ctx.master_port),
    )
    from torch.nn.parallel import DistributedDataParallel

    from elastic_pipe.integrations import reduced_parameters

    model = tiny_bert()
    # 3 steps per epoch and rank; decisions after steps 2, 4, 6, 8 (epochs 0, 1, 2, 2)
    callback = FreezeCallback(freeze.ManualSchedule(LAYERS, {1: 2, 2: 3}), decide_every=2, cache=cache)
    # the Trainer's default for a PreTrainedModel: find_unused_parameters=True, which the callback turns off
    args = arguments(Path(out), ddp_backend="gloo", remove_unused_columns=not cache)  # the cache keys on idx
    data = Indexed() if cache else Tokens()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    ddp = trainer.model_wrapped
    assert isinstance(ddp, DistributedDataParallel), type(ddp)
    reduced = {id(p) for p in reduced_parameters(ddp)}
    return {
        "frozen": callback.frozen,
        "events": [(e["step"], e["frozen"]) for e in callback.controller.events],
        "reduced_equals_trainable": reduced == {id(p) for p in model.parameters() if p.requires_grad},
        "find_unused": ddp.find_unused_parameters,
        "params": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),  # plain data crosses
        "cached": None if callback.cache is None else callback.cache.filled,
    }


@pytest.mark.distributed
@pytest.mark.slow  # two spawned ranks importing the trainer: 20-30 s on the shared 2-core machine
def test_ddp_replicas_stay_identical_and_frozen_blocks_are_not_reduced(tmp_path: Path) -> None:
    results = run_distributed(_ddp_rank, 2, str(tmp_path), timeout=240.0)
    assert [r["events"] for r in results] == [[(4, 2), (6, 3)]] * 2
    assert all(r["reduced_equals_trainable"] for r in results)
    assert [r["find_unused"] for r in results] == [False, False]
    assert results[0]["params"] == results[1]["params"]  # bit-identical replicas


@pytest.mark.distributed
@pytest.mark.slow  # as above
def test_ddp_with_the_cache_fills_each_ranks_share_and_keeps_replicas_identical(tmp_path: Path) -> None:
    plain = run_distributed(_ddp_rank, 2, str(tmp_path / "plain"), timeout=240.0)
    cached = run_distributed(_ddp_rank, 2, str(tmp_path / "cached"), True, timeout=240.0)
    assert [r["events"] for r in cached] == [r["events"] for r in plain] == [[(4, 2), (6, 3)]] * 2
    assert all(r["reduced_equals_trainable"] for r in cached)
    assert [r["find_unused"] for r in cached] == [False, False]
    assert cached[0]["params"] == cached[1]["params"]  # bit-identical replicas with the cache too
    # each rank's sampler gives it half the samples (3 steps of 8 an epoch), and each rank fills only its own: the
    # 2 blocks frozen at step 4 are filled for the epoch's 2 remaining steps (16 rows), the boundary after 3 blocks
    # (step 6) for every one of the rank's 24 samples in the last epoch; nothing twice, nothing of the other rank's
    assert [r["cached"] for r in cached] == [2 * BATCH + SAMPLES // 2] * 2
    # the cached boundary serves what the frozen blocks computed: the same training as without the cache
    torch.testing.assert_close(torch.tensor(cached[0]["params"]), torch.tensor(plain[0]["params"]))
