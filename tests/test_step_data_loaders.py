"""A dataset split's loaders persist across epochs (rebuilt only at a re-shard), and a step that needs only labels
reads them from the dataset's ``targets``/``labels`` without reading an item."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.data import ElasticSampler
from elastic_pipe.orchestrator.data import DatasetSplit, ElasticBatchSampler, epoch_plan
from elastic_pipe.orchestrator.data.items import item_spec, label_table
from elastic_pipe.orchestrator.data.loader_pool import MIN_PART, Parts, cut
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.testing import RankContext, run_distributed, run_tasks

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))

from plug_data import MEAN, STD, Digits  # noqa: E402

CPU = torch.device("cpu")


class Pids(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Item ``i``: input ``[pid of the reading process, i]``, label ``i % 10``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(os.getpid()), float(index)], dtype=torch.float64), index % 10


def _split(dataset: Any, workers: int) -> DatasetSplit:
    return DatasetSplit(dataset, torch.arange(len(dataset)), item_spec(dataset, 10), torch.float64, workers)


def _epoch(part: DatasetSplit, sampler: ElasticSampler, sizes: list[int], steps: int | None = None) -> list[Any]:
    """Read ``steps`` steps (all: ``None``) from the sampler's position, advancing it: ``(positions, x)`` each."""
    got = []
    batches = part.batches(ElasticBatchSampler(sampler, sizes), inputs=True, labels=True, device=CPU)
    for i, (pos, x, y) in enumerate(batches):
        assert x is not None and y is not None
        assert x[:, 1].long().tolist() == pos.tolist() and y.tolist() == [p % 10 for p in pos.tolist()]
        got.append((pos.tolist(), x))
        sampler.advance(sizes[i])
        if steps is not None and i + 1 == steps:
            break
    batches.close()
    return got


def test_the_loader_and_its_workers_persist_across_epochs_and_are_rebuilt_at_a_reshard() -> None:
    part = _split(Pids(48), workers=1)
    sampler = ElasticSampler(48, 1, 0, seed=0)
    plan = epoch_plan(48, 8, 2)
    pids = []
    try:
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            got = _epoch(part, sampler, plan.sizes())
            assert sorted(p for pos, _ in got for p in pos) == list(range(48))  # every sample once
            pids.append({int(v) for _, x in got for v in x[:, 0].tolist()})
        assert part.loaders_built == 1  # one loader, two epochs
        assert len(pids[0]) == 1 and pids[0] == pids[1] and os.getpid() not in pids[0]  # the same worker
        # a decision point inside epoch 2 that keeps the layout: the loader is closed early and read on
        sampler.set_epoch(2)
        first = _epoch(part, sampler, plan.sizes(), steps=2)
        rest = _epoch(part, sampler, plan.sizes(2))
        assert part.loaders_built == 1
        assert sorted(p for pos, _ in first + rest for p in pos) == list(range(48))  # read-ahead discarded
        # epoch 3: a re-shard to 2 replicas after 2 steps rebuilds the loader, from the sampler's position
        sampler.set_epoch(3)
        first = _epoch(part, sampler, plan.sizes(), steps=2)
        sampler.reshard(2, 0)
        mine = _epoch(part, sampler, plan.sizes(2))
        assert part.loaders_built == 2
        assert [len(pos) for pos, _ in mine] == [4] * 4
        assert {int(v) for _, x in mine for v in x[:, 0].tolist()}.isdisjoint(pids[0])  # a new worker
        assert sampler.exhausted
    finally:
        part.close()
    worker = next(iter(pids[0]))
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # shut down by the re-shard, not left behind


def test_a_second_reader_of_the_same_loader_gets_its_own() -> None:
    part = _split(Pids(16), workers=0)
    lists = [[0, 1], [2, 3], [4, 5]]
    first = part.batches(lists, inputs=True, labels=False, device=CPU)
    assert next(first).positions.tolist() == [0, 1]
    second = list(part.batches(lists, inputs=True, labels=False, device=CPU))  # while the first is open
    assert [b.positions.tolist() for b in second] == lists
    assert [b.positions.tolist() for b in first] == lists[1:]  # the first reads on, undisturbed
    assert part.loaders_built == 2
    list(part.batches(lists, inputs=True, labels=False, device=CPU))
    assert part.loaders_built == 2  # the kept loader is free again


class RandomPids(Pids):
    """:class:`Pids` declaring random transforms."""

    random_augmentation = True


@pytest.mark.parametrize("random", [False, True])
def test_a_read_of_fewer_parts_is_served_by_an_idle_loader_of_more_unless_the_items_are_random(random: bool) -> None:
    part = _split((RandomPids if random else Pids)(64), workers=1)
    lists = [[0, 1], [2, 3]]
    try:
        both = list(part.batches(lists, inputs=True, labels=True, device=CPU))
        alone = list(part.batches(lists, inputs=True, labels=False, device=CPU))
        assert all(b.labels is not None for b in both) and all(b.labels is None for b in alone)  # dropped
        assert [b.positions.tolist() for b in alone] == lists
        same = all(torch.equal(a.inputs, b.inputs) for a, b in zip(alone, both, strict=True))  # type: ignore[arg-type]
        assert same == (not random)  # read by the same worker (its pid in column 0), or by a new loader's
        assert part.loaders_built == (2 if random else 1)
        # a steps loader (a sampler's shard) serves a plain read too, but is never served by another
        sampler = ElasticSampler(64, 1, 0, seed=0)
        _epoch(part, sampler, epoch_plan(64, 8, 1).sizes())
        assert part.loaders_built == (3 if random else 2)
        list(part.batches(lists, inputs=True, labels=False, device=CPU))
        assert part.loaders_built == (3 if random else 2)  # random: its own loader, kept since the second read
    finally:
        part.close()


class Targets(Digits):
    """Digits whose labels are a ``targets`` list (torchvision's way) or not exposed at all; reading a training
    sample once ``forbidden`` holds it raises (``strict``) or is counted."""

    def __init__(self, samples: int, targets: bool, strict: bool) -> None:
        super().__init__(samples)
        self._y = self.labels
        del self.labels
        if targets:
            self.targets = self._y.tolist()
        self.strict = strict
        self.forbidden: frozenset[int] = frozenset()
        self.reads = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index in self.forbidden:
            if self.strict:
                raise RuntimeError(f"item {index} read after the cache held every training sample")
            self.reads += 1
        return (self.images[index] - MEAN) / STD, int(self._y[index])


def test_labels_come_from_targets_without_reading_an_item() -> None:
    ds = Targets(40, targets=True, strict=True)
    part = _split(ds, workers=0)
    ds.forbidden = frozenset(range(40))
    got = list(part.batches([[3, 0], [39]], inputs=False, labels=True, device=CPU))
    y = ds._y.tolist()
    assert [b.labels.tolist() for b in got if b.labels is not None] == [[y[3], y[0]], [y[39]]]
    assert all(b.inputs is None for b in got) and part.loaders_built == 0
    with pytest.raises(RuntimeError, match="item 3 read"):  # inputs still come from the items
        list(part.batches([[3]], inputs=True, labels=True, device=CPU))
    # no usable attribute: the labels are read from the items
    plain = Targets(40, targets=False, strict=False)
    assert label_table(plain, item_spec(plain)) is None
    fallback = _split(plain, 0)
    plain.forbidden = frozenset(range(40))
    got = list(fallback.batches([[3, 0]], inputs=False, labels=True, device=CPU))
    assert got[0].labels is not None and got[0].labels.tolist() == [y[3], y[0]] and plain.reads == 2


def test_a_label_table_is_used_only_when_it_fits_the_items() -> None:
    ds = Targets(20, targets=True, strict=False)
    spec = item_spec(ds, 10)
    table = label_table(ds, spec)
    assert table is not None and table.dtype == torch.int64 and table.tolist() == ds._y.tolist()
    ds.targets = ds.targets[:-1]  # not one per item
    assert label_table(ds, spec) is None
    ds.targets = [[v] for v in ds._y.tolist()]  # shaped unlike item 0's label
    assert label_table(ds, spec) is None
    ds.targets = ds._y.tolist()
    ds.target_transform = lambda y: y  # torchvision: targets are not what __getitem__ returns
    assert label_table(ds, spec) is None
    del ds.target_transform
    ds.targets = [*ds._y.tolist()[:-1], 10]
    with pytest.raises(ConfigError, match=r"dataset item 19: label 10 \(the dataset's targets\) is out of range"):
        label_table(ds, spec)
    # the up-front check compares every item's label with the table a labels-only step would read
    ds.targets = [(v + 1) % 10 if i == 7 else v for i, v in enumerate(ds._y.tolist())]
    found = _split(ds, 0).with_classes(10).first_bad_item(0, 1)
    assert found is not None and found[0] == 7 and "differs from the dataset's targets/labels" in found[1]


# ------------------------------------------------------------------------------------------------- training
def _train(ctx: RankContext, targets: bool) -> dict[str, Any]:
    """3 epochs on one rank, 2 of 3 blocks frozen (and cached) before epoch 1; once the cache holds every
    training sample, reading one raises (with ``targets``) or is counted (without)."""
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    config = config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True},
            "train": {"dtype": "float64", "epochs": 3, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "manual", "options": {"schedule": {1: 2}}},
            "pipeline": {"pipe_len": 1, "microbatches": 1, "cache": "on"},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )
    ds = Targets(200, targets=targets, strict=targets)
    complete = []

    def guard(trainer: ElasticTrainer) -> None:
        complete.append(trainer.prefix.cache_complete)
        if trainer.prefix.cache_complete:
            ds.forbidden = frozenset(trainer.ctx.train_set.sample_ids.tolist())

    with ElasticTrainer(config, data=ds, quiet=True) as trainer:
        result = trainer.fit(on_epoch_end=guard).to_dict()
    return {"losses": result["losses"], "complete": complete, "reads": ds.reads}


@pytest.mark.distributed
def test_a_dataset_with_targets_trains_without_reading_items_once_the_cache_holds_them() -> None:
    # with targets, then without, in one job (each run has its own dataset and trainer)
    (runs,) = run_distributed(run_tasks, 1, {True: (_train, (True,)), False: (_train, (False,))}, timeout=480)
    with_targets, without = runs[True], runs[False]
    assert with_targets["complete"] == [True, True, True]  # after the transition before epoch 1
    assert without["reads"] > 0  # the fallback decodes the items for their labels
    assert with_targets["losses"] == without["losses"]  # the same labels either way


class HalfItems(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Item ``i``: a bfloat16 input ``[i + 1/3, -i]``, label ``i % 10``."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([index + 1 / 3, -index], dtype=torch.bfloat16), index % 10


def test_floating_inputs_leave_the_workers_as_the_dataset_made_them_and_are_cast_after_the_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    part = _split(HalfItems(), workers=1)  # parameters in float64
    handed_over: list[torch.dtype] = []
    build = DatasetSplit._loader

    def recording(self: DatasetSplit, *args: Any, **kwargs: Any) -> Any:
        loader = build(self, *args, **kwargs)

        class Recorded:
            def __iter__(self) -> Any:
                for x, y in loader:
                    handed_over.append(x.dtype)
                    yield x, y

        return Recorded()

    monkeypatch.setattr(DatasetSplit, "_loader", recording)
    batches = list(part.batches([[0, 5, 7], [23]], inputs=True, labels=True, device=CPU))
    part.close()
    assert handed_over == [torch.bfloat16, torch.bfloat16]  # half the bytes out of the workers
    for (pos, x, _), expected in zip(batches, ([0, 5, 7], [23]), strict=True):
        assert pos.tolist() == expected and x is not None and x.dtype == torch.float64
        want = torch.stack([HalfItems()[i][0] for i in expected]).to(torch.float64)
        assert torch.equal(x, want)


def test_a_steps_batch_is_read_in_parts_by_several_workers_at_once_and_comes_back_whole_and_in_order() -> None:
    part = _split(Pids(256), workers=2)
    sampler = ElasticSampler(256, 1, 0, seed=3)
    plan = epoch_plan(256, 96, 1)  # steps of 96, 96 and 64 positions: each cut in two parts of >= 32
    try:
        sampler.set_epoch(0)
        got = _epoch(part, sampler, plan.sizes())  # checks each row's index and label against its position
        assert [len(pos) for pos, _ in got] == [96, 96, 64]
        assert sorted(p for pos, _ in got for p in pos) == list(range(256))
        for pos, x in got:
            half = len(pos) // 2
            first, second = {int(v) for v in x[:half, 0].tolist()}, {int(v) for v in x[half:, 0].tolist()}
            assert len(first) == len(second) == 1 and first != second  # each half read by another worker
        assert part.loaders_built == 1
    finally:
        part.close()


def test_input_rows_are_read_by_the_workers_of_a_kept_loader_and_equal_the_rows_read_in_process() -> None:
    in_process = _split(Pids(200), workers=0)
    part = _split(Pids(200), workers=2)
    try:
        rows = part.input_rows(10, 150)
        assert rows.dtype == torch.float64 and rows[:, 1].tolist() == [float(i) for i in range(10, 150)]
        pids = {int(v) for v in rows[:, 0].tolist()}
        assert len(pids) == 2 and os.getpid() not in pids  # two workers, side by side
        again = part.input_rows(0, 200)
        assert {int(v) for v in again[:, 0].tolist()} == pids  # the same workers: one loader, kept
        assert part.loaders_built == 1
        assert torch.equal(again[:, 1], in_process.input_rows(0, 200)[:, 1])
        small = part.input_rows(0, 40)  # too few rows for two parts: read in this process
        assert {int(v) for v in small[:, 0].tolist()} == {os.getpid()} and part.loaders_built == 1
    finally:
        part.close()


def test_start_steps_starts_the_workers_that_the_steps_then_read_through() -> None:
    part = _split(Pids(48), workers=1)
    sampler = ElasticSampler(48, 1, 0, seed=0)
    plan = epoch_plan(48, 8, 2)
    try:
        assert part.start_steps(inputs=True, labels=True, device=CPU, shard=(1, 0))
        ((key, entry),) = part._pool._entries.items()  # the pool's one loader: its workers are up, nothing read
        workers = entry.loader._iterator._workers
        assert key.kind == "steps" and key.shard == (1, 0) and [w.is_alive() for w in workers] == [True]
        assert not part.start_steps(inputs=True, labels=True, device=CPU, shard=(1, 0))  # already kept
        sampler.set_epoch(0)
        got = _epoch(part, sampler, plan.sizes())
        assert sorted(p for pos, _ in got for p in pos) == list(range(48))
        assert {int(v) for _, x in got for v in x[:, 0].tolist()} == {workers[0].pid}  # the worker started above
        assert part.loaders_built == 1
        # another shard replaces it (its worker shut down); one that reads other parts of the items likewise
        assert part.start_steps(inputs=True, labels=True, device=CPU, shard=(2, 1))
        workers[0].join(10)
        assert part.loaders_built == 2 and not workers[0].is_alive()
        # a reader of the kind still open: nothing is started beside it
        sampler.reshard(2, 1)
        sampler.set_epoch(1)
        open_reader = part.batches(ElasticBatchSampler(sampler, plan.sizes()), inputs=True, labels=True, device=CPU)
        next(open_reader)
        assert not part.start_steps(inputs=True, labels=False, device=CPU, shard=(2, 1))
        open_reader.close()
        assert part.loaders_built == 2
    finally:
        part.close()


def test_the_splits_loaders_are_shut_down_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.orchestrator.data import close_splits

    # random items: the steps' loader does not serve the training split's rows, which keep a loader of their own
    train, held_out = _split(RandomPids(96), workers=2), _split(Pids(48), workers=1)
    try:
        assert train.start_steps(inputs=True, labels=True, device=CPU, shard=(1, 0))
        train.input_rows(0, 96)  # a second kept loader of the training split ("rows")
        next(held_out.batches([[0, 1]], inputs=True, labels=False, device=CPU))  # and one of the held-out split
        loaders = [e.loader for part in (train, held_out) for e in part._pool._entries.values()]
        workers = [w for loader in loaders for w in loader._iterator._workers]
        assert len(loaders) == 3 and all(w.is_alive() for w in workers)
        # each shutdown waits until all three have begun: shut down one after the other, the first would wait for
        # the others forever (here: until the barrier breaks)
        barrier = threading.Barrier(len(loaders), timeout=60)
        iterator = torch.utils.data.dataloader._MultiProcessingDataLoaderIter
        shutdown = iterator._shutdown_workers

        def together(self: Any) -> None:
            if not self._shutdown:
                barrier.wait()
            shutdown(self)

        monkeypatch.setattr(iterator, "_shutdown_workers", together)
        close_splits([train, held_out, "samples in memory"])
        assert not barrier.broken
        assert not any(w.is_alive() for w in workers)
        assert train._pool.keys() == [] and held_out._pool.keys() == []
    finally:
        monkeypatch.undo()
        train.close()
        held_out.close()


def test_start_steps_does_nothing_without_workers_or_without_items_to_read() -> None:
    assert not _split(Pids(16), workers=0).start_steps(inputs=True, labels=True, device=CPU, shard=(1, 0))
    ds = Targets(40, targets=True, strict=False)
    part = _split(ds, workers=1)
    try:
        assert not part.start_steps(inputs=False, labels=True, device=CPU, shard=(1, 0))  # labels from targets
        assert not part.start_steps(inputs=False, labels=False, device=CPU, shard=(1, 0))  # a middle stage
        assert part.loaders_built == 0
    finally:
        part.close()


def test_the_trainer_starts_the_steps_loader_as_it_enters_the_layout_and_the_epochs_read_through_it(
    monkeypatch: pytest.MonkeyPatch, one_rank_here: None
) -> None:
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    config = config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True, "workers": 1},
            "train": {"dtype": "float64", "epochs": 2, "global_batch": 32, "optimizer": "sgd", "lr": 0.05},
            "freeze": {"policy": "never"},
            "pipeline": {"pipe_len": 1, "microbatches": 1, "cache": "off"},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )
    calls: list[tuple[bool, bool, tuple[int, int], bool]] = []
    start = DatasetSplit.start_steps

    def recording(self: DatasetSplit, **kwargs: Any) -> bool:
        started = start(self, **kwargs)
        calls.append((kwargs["inputs"], kwargs["labels"], kwargs["shard"], started))
        return started

    monkeypatch.setattr(DatasetSplit, "start_steps", recording)
    built: list[int] = []
    with ElasticTrainer(config, data=Digits(96), quiet=True) as trainer:
        trainer.fit(on_epoch_end=lambda t: built.append(t.ctx.train_set.loaders_built))
    assert calls == [(True, True, (1, 0), True)]
    assert built == [1, 1]  # the steps of both epochs read through the loader started as the trainer entered


#: Set by the reading process before its loader starts: a forked worker sees the value, a spawned one imports this
#: module again and sees 0.
MARK = [0]


class Marked(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Item ``i``: input ``[MARK as the reading process sees it, i]``."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(MARK[0]), float(index)], dtype=torch.float64), index % 10


def _read_in_a_spawned_process(queue: Any) -> None:
    import multiprocessing

    MARK[0] = 7
    part = _split(Marked(), workers=1)
    batch = next(part.batches([[0, 1]], inputs=True, labels=False, device=CPU))
    part.close()
    assert batch.inputs is not None
    queue.put((multiprocessing.get_start_method(), batch.inputs[:, 0].tolist()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is the workers' start on Linux only")
def test_loader_workers_are_forked_even_in_a_spawned_process_such_as_a_cli_rank() -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # as elastic-pipe train starts its ranks
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_a_spawned_process, args=(queue,))
    child.start()
    method, marks = queue.get(timeout=240)
    child.join(60)
    assert method == "spawn"  # the process's own default: what a loader would have used
    assert marks == [7.0, 7.0]  # yet its worker saw the reader's memory: forked


class _Inherited:
    """Part of an unreachable cycle: finalizing it records the pid of the process that did (one line in ``path``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.me = self

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class _Collecting(Pids):
    """Pids whose reads in a worker run a full garbage collection there (a worker's own GC, made certain)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.reader = os.getpid()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import gc

        if os.getpid() != self.reader:
            gc.collect()
        return super().__getitem__(index)


def test_a_loader_worker_never_collects_garbage_it_inherited(tmp_path: Path) -> None:
    """A forked worker that collects an unreachable cycle it inherited finalizes the parent's objects in the child:
    for a cycle holding a CUDA tensor that kills the worker (CUDA cannot be used after a fork). The workers are
    forked with everything the reader held out of the collector's reach (``loader_pool.forking``)."""
    import gc

    marks = tmp_path / "finalized"
    gc.disable()  # the cycle must still exist when the workers fork
    try:
        _Inherited(marks)  # unreachable at once: only the cycle keeps it
        part = _split(_Collecting(8), workers=2)
        got = [
            b.positions.tolist()
            for b in part.batches([[0, 1, 2, 3], [4, 5, 6, 7]], inputs=True, labels=False, device=CPU)
        ]
        part.close()
    finally:
        gc.enable()
    gc.collect()  # here, in the reader, the cycle goes
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert marks.read_text().split() == [str(os.getpid())]  # finalized once, by the reader, never in a worker


def _run_counting_loaders(freeze: dict[str, Any], *, cache: str) -> tuple[Any, list[tuple[int, int]], bool]:
    """A 3-epoch run of the tiny ViT on one rank, one loader worker: its result, the loaders each split had built
    at every epoch's end (training, held-out), and whether the cache ended complete."""
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    config = config_from_tables(
        {
            "model": tiny_vit.model_table(),
            "data": {"drop_last": True, "workers": 1},
            "train": {"dtype": "float64", "epochs": 3, "global_batch": 16, "optimizer": "sgd", "lr": 0.05},
            "freeze": freeze,
            "pipeline": {"pipe_len": 1, "microbatches": 1, "cache": cache},
            "launch": {"nproc_per_node": 1},
            "log": {"progress": False},
        }
    )
    built: list[tuple[int, int]] = []
    with ElasticTrainer(config, data=Digits(96), quiet=True) as trainer:
        result = trainer.fit(
            on_epoch_end=lambda t: built.append((t.ctx.train_set.loaders_built, t.ctx.eval_set.loaders_built))
        )
        return result, built, trainer.prefix.cache_complete


def test_the_probe_reads_its_inputs_without_a_loader_so_the_evaluation_keeps_its_workers(
    one_rank_here: None,
) -> None:
    # A probe-driven policy runs its probe batch (the held-out split's first rows) at every decision point. Read
    # through the held-out split's kept loaders, it replaced the evaluation's loader (the same kind of read, other
    # parts of the items) at every decision point and the evaluation then built it again: two forks of the
    # training process per decision point (about 0.7 s per epoch of ViT-B/16 on one H200, issue #41).
    # nothing is ever still: the probe runs at all 4 decision points of every epoch, nothing freezes
    freeze = {"policy": "drift", "options": {"threshold": 0.0, "relative": None, "settle": None}}
    result, built, _ = _run_counting_loaders(freeze, cache="off")
    assert result.transitions == [] and len(result.epochs) == 3
    assert built == [(1, 1), (1, 1), (1, 1)]  # one loader per split for the whole run


@pytest.mark.parametrize(("n", "workers", "parts"), [(0, 4, 1), (31, 4, 1), (64, 4, 2), (130, 4, 4), (1000, 0, 1)])
def test_a_list_is_cut_into_one_part_per_worker_of_at_least_min_part(n: int, workers: int, parts: int) -> None:
    positions = list(range(100, 100 + n))
    pieces = cut(positions, workers)
    assert len(pieces) == parts
    assert [p for piece in pieces for p in piece] == positions
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    assert n < MIN_PART or min(map(len, pieces)) >= MIN_PART
    assert list(Parts([positions, positions[:10]], workers)) == [*pieces, positions[:10]]


def test_a_transition_reads_the_cache_fill_and_the_evaluation_store_through_loaders_already_running(
    one_rank_here: None,
) -> None:
    # Freezing 2 sub-layers with the cache on reads every training sample once (the fill) and every held-out one
    # once (the evaluation store), both inputs only. Each read had a loader of its own: the fill forked the
    # training split's workers a second time, and the store replaced the evaluation's loader (the same kind of
    # read, fewer parts of the items), forking the held-out split's workers again: a fifth to a quarter of a second
    # per such transition on one H100 (issue #41). The idle loaders already running read them now.
    result, built, complete = _run_counting_loaders({"policy": "manual", "options": {"schedule": {1: 2}}}, cache="on")
    assert [t["frozen_units"] for t in result.transitions] == [2] and complete  # the fill and the store ran
    assert built == [(1, 1), (1, 1), (1, 1)]  # one loader per split for the whole run
