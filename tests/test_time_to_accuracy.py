"""The time-to-accuracy benchmark's logic on synthetic curves: the time-to-target reader, the per-arm summary, merging
partial reports; its data order and LoRA arms on a tiny model (benchmarks/time_to_accuracy.py, issue #41)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from script_module import load_script


@pytest.fixture(scope="module")
def tta() -> Any:
    return load_script(Path("benchmarks/time_to_accuracy.py"))


def _linear_run(start: float, rate: float, evals: list[float], total: float) -> dict[str, Any]:
    """A run whose accuracy rises linearly with wall seconds (capped at 1), evaluated at the times ``evals``."""
    curve = [[t, min(1.0, start + rate * t)] for t in evals]
    return {"curve": curve, "accuracy": curve[-1][1], "total_seconds": total}


def _first_eval_at_or_after(evals: list[float], start: float, rate: float, target: float) -> float | None:
    """Where a linear curve crosses ``target``, moved to the next evaluation (worked out analytically)."""
    crossing = (target - start) / rate
    later = [t for t in evals if t >= crossing - 1e-9]
    return later[0] if later and min(1.0, start + rate * later[0]) >= target - 1e-12 else None


def test_time_to_target_is_the_first_evaluation_at_or_above_it(tta: Any) -> None:
    curve = [[1.0, 0.5], [2.0, 0.8], [3.0, 0.7], [4.0, 0.9]]
    assert tta.time_to_target(curve, 0.8) == 2.0  # equal counts; a later dip does not matter
    assert tta.time_to_target(curve, 0.85) == 4.0
    assert tta.time_to_target(curve, 0.4) == 1.0
    assert tta.time_to_target(curve, 0.95) is None
    assert tta.time_to_target([], 0.1) is None


def test_summary_targets_the_reference_less_half_a_point(tta: Any) -> None:
    evals = [float(t) for t in range(1, 11)]
    params = {  # arm -> per seed (start, rate, total seconds)
        "elastic-none": [(0.80, 0.015, 11.0), (0.79, 0.016, 11.5)],
        "compiled": [(0.78, 0.02, 10.5), (0.80, 0.018, 10.0)],
        "elastic-default": [(0.85, 0.03, 7.0), (0.84, 0.035, 7.5)],
        "lora-qkv-r8": [(0.70, 0.01, 6.0), (0.72, 0.02, 6.0)],  # seed 0 never gets there
    }
    runs = {
        arm: {str(s): _linear_run(a, b, evals, tot) for s, (a, b, tot) in enumerate(seeds)}
        for arm, seeds in params.items()
    }
    report = tta.summarise(runs)
    finals = [min(1.0, a + b * evals[-1]) for a, b, _ in params["elastic-none"]]
    target = statistics.fmean(finals) - 0.005
    assert report["target"] == pytest.approx(target)
    for arm, seeds in params.items():
        a = report["arms"][arm]
        want = {str(s): _first_eval_at_or_after(evals, x, r, target) for s, (x, r, _) in enumerate(seeds)}
        assert a["time_to_target_by_seed"] == want
        reached = [v for v in want.values() if v is not None]
        assert a["reached"] == f"{len(reached)}/{len(want)}"
        assert a["time_to_target_mean"] == (statistics.fmean(reached) if len(reached) == len(want) else None)
        accs = [min(1.0, x + r * evals[-1]) for x, r, _ in seeds]
        assert a["accuracy_mean"] == pytest.approx(statistics.fmean(accs))
        assert a["accuracy_spread"] == pytest.approx(max(accs) - min(accs))
        assert a["total_seconds_mean"] == pytest.approx(statistics.fmean(t for *_, t in seeds))
    arms = report["arms"]
    assert arms["lora-qkv-r8"]["time_to_target_mean"] is None
    assert arms["lora-qkv-r8"]["time_to_target_speedup_vs_compiled"] is None
    speedup = arms["compiled"]["time_to_target_mean"] / arms["elastic-default"]["time_to_target_mean"]
    assert arms["elastic-default"]["time_to_target_speedup_vs_compiled"] == pytest.approx(speedup)
    assert speedup > 1  # the faster curve gets there sooner
    assert arms["compiled"]["total_speedup_vs_compiled"] == pytest.approx(1.0)
    assert arms["elastic-none"]["accuracy_vs_reference_points"] == pytest.approx(0.0)


def test_summary_without_the_reference_has_no_target(tta: Any) -> None:
    runs = {"eager": {"0": _linear_run(0.5, 0.1, [1.0, 2.0], 2.0)}}
    report = tta.summarise(runs)
    assert report["target"] is None
    assert report["arms"]["eager"]["time_to_target_by_seed"] == {"0": None}


def test_merge_joins_seeds_and_summarises_again(tta: Any, tmp_path: Path) -> None:
    evals = [1.0, 2.0, 3.0]
    parts = []
    for seed, rate in ((0, 0.05), (1, 0.08)):
        arms = ((1, "elastic-none"), (2, "compiled"))
        runs = {arm: {str(seed): _linear_run(0.7, rate * k, evals, 3.0 * k)} for k, arm in arms}
        report = {"task": "t", "description": "d", "seeds": [seed], "runs": runs, "commit": "c", "dirty": False,
                  "device": "cpu", "torch": torch.__version__, **tta.summarise(runs)}  # fmt: skip
        path = tmp_path / f"part{seed}.json"
        path.write_text(json.dumps(report))
        parts.append((path, runs))
    merged = tta.merge([p for p, _ in parts])
    joined = {arm: {**parts[0][1][arm], **parts[1][1][arm]} for arm in parts[0][1]}
    assert merged["seeds"] == [0, 1]
    assert [part["seeds"] for part in merged["parts"]] == [[0], [1]]  # each part as it was, the first one too
    assert merged["runs"] == joined
    assert merged["arms"] == tta.summarise(joined)["arms"]
    assert merged["target"] == pytest.approx(statistics.fmean(r["accuracy"] for r in joined["elastic-none"].values())
                                             - 0.005)  # fmt: skip


def test_epoch_batches_are_the_samplers_whole_batches(tta: Any) -> None:
    n, batch = 50, 8
    order = tta.EpochBatches(n, batch, seed=3)
    epochs = []
    for epoch in range(2):
        order.set_epoch(epoch)
        steps = list(order)
        assert len(steps) == len(order) == n // batch
        flat = [i for s in steps for i in s]
        assert all(len(s) == batch for s in steps) and len(set(flat)) == len(flat) == n - n % batch
        epochs.append(flat)
    assert epochs[0] != epochs[1]  # a new order every epoch
    again = tta.EpochBatches(n, batch, seed=3)
    again.set_epoch(1)
    assert [i for s in again for i in s] == epochs[1]  # the seed fixes it


def test_augmented_reads_are_crops_and_flips_of_the_image(tta: Any) -> None:
    image = torch.arange(36, dtype=torch.float32).reshape(1, 6, 6)
    plain = tta.TensorSet(image[None], torch.tensor([3]))
    assert not plain.random_augmentation
    x, y = plain[0]
    assert torch.equal(x, image) and y == 3
    augmented = tta.TensorSet(image[None], torch.tensor([3]), pad=2)
    assert augmented.random_augmentation
    padded = torch.nn.functional.pad(image[None], (2, 2, 2, 2), mode="replicate")[0]
    torch.manual_seed(0)
    reads = [augmented[0][0] for _ in range(20)]
    for r in reads:
        assert r.shape == image.shape
        windows = [padded[:, i : i + 6, j : j + 6] for i in range(5) for j in range(5)]
        assert any(torch.equal(r, w) or torch.equal(r, w.flip(-1)) for w in windows)
    assert len({tuple(r.flatten().tolist()) for r in reads}) > 1


def test_lora_trains_the_adapters_and_the_head_only(tta: Any) -> None:
    pytest.importorskip("peft")
    from elastic_pipe import models

    model = models.vit(config="vit-tiny")
    x = torch.randn(3, 1, 8, 8)
    before = model(x)
    head = {id(p) for p in model.slice(model.head_start(), model.num_sublayers).parameters()}
    lora = tta.add_lora(model, 8, ("qkv",))
    trainable = [(n, p) for n, p in lora.named_parameters() if p.requires_grad]
    adapters = [n for n, _ in trainable if "lora_" in n]
    assert len(adapters) == 2 * model.num_units  # A and B on each block's qkv
    assert all("qkv" in n for n in adapters)
    assert {id(p) for n, p in trainable if "lora_" not in n} == head
    assert torch.allclose(lora(x), before)  # LoRA's B starts at zero: the checkpoint's function


@pytest.mark.parametrize(("autocast", "workers"), [(False, 0), (True, 0), (False, 2)])
def test_the_plain_loop_trains_as_the_trainer_does(tta: Any, one_rank_here: None, autocast: bool, workers: int) -> None:
    """Without dropout or augmentation, the eager loop and ``elastic-none`` (``ElasticTrainer.fit()``) score the same
    held-out accuracy after every epoch: the same order, optimizer, schedule and evaluation, the same bf16 autocast
    (the forward under it, the loss in float32), and with loader workers the same batches (the trainer reads a
    batch of 64 in two parts, one per worker, and joins them)."""
    from elastic_pipe import models
    from elastic_pipe.data import load_digits

    d = load_digits()
    x = (d.inputs - d.inputs.mean()) / d.inputs.std()
    base = models.vit(config="vit-tiny", depth=2, dropout=0.0)
    train, held_out = tta.TensorSet(x[:384], d.labels[:384]), tta.TensorSet(x[1400:], d.labels[1400:])
    batch = 64 if workers else 32  # 64: two parts of at least loader_pool.MIN_PART = 32 positions
    task = tta.Task("t", "t", "vit", tta.copies(base), train, held_out, epochs=3, batch=batch, lr=2e-3)
    setting = tta.Setting(torch.device("cpu"), autocast, workers, "off", False, "bypass", 1, 64)
    plain = tta.plain_run(task, task.build(), setting, 1, compiled=False)
    elastic = tta.elastic_run(task, task.build(), setting, 1, tta.ELASTIC_ARMS["elastic-none"])
    accuracies = [acc for _, acc in plain["curve"]]
    assert len(accuracies) == task.epochs
    assert accuracies == pytest.approx([acc for _, acc in elastic["curve"]], abs=1e-9)
    assert max(accuracies) > 0.2  # it learned (10 classes: chance is 0.1)
    parts = elastic["epoch_parts"]  # each epoch's parts, as its record gave them
    assert [p["steps"] for p in parts] == [384 // batch] * task.epochs
    assert all(set(p) == set(tta.EPOCH_PARTS) for p in parts)
    assert all(0 < p["forward_s"] + p["backward_s"] < p["seconds"] for p in parts)


@pytest.mark.parametrize(("name", "task"), [("bbc", "(a)"), ("digits", "(b)")])
def test_the_measured_table_in_the_docs_is_the_result_file(tta: Any, name: str, task: str) -> None:
    """docs/time_to_accuracy.md quotes the table the benchmark prints for each results JSON, which names a clean
    commit and holds seeds 0-2 for every arm; a re-run writes a new JSON, and the doc must quote its table."""
    root = Path(__file__).resolve().parent.parent
    report = json.loads((root / f"benchmarks/results/time_to_accuracy_{name}.json").read_text(encoding="utf-8"))
    assert report["dirty"] is False and len(report["commit"]) >= 7
    assert sorted(report["seeds"]) == [0, 1, 2]
    assert all(sorted(runs) == ["0", "1", "2"] for runs in report["runs"].values())
    doc = (root / "docs/time_to_accuracy.md").read_text(encoding="utf-8")
    assert tta.table(report) in doc
    assert tta.paired_table(report) in doc  # and every arm against the plain eager loop, seed by seed
    assert f"at {report['commit'][:7]} (`benchmarks/results/time_to_accuracy_{name}.json`" in " ".join(doc.split())
    assert f"task {task}, three seeds" in doc.split("\n## Measured on one", 1)[1].splitlines()[0]


def test_a_policy_arm_names_its_policy_and_options_and_refuses_unknown_policies(tta: Any) -> None:
    name, table = tta.variant_arm("drift:max_fraction=0.95,settle=null")
    assert name == "elastic-drift:max_fraction=0.95,settle=null"
    assert table == {"policy": "drift", "options": {"max_fraction": 0.95, "settle": None}}
    assert tta.variant_arm("alpha:alpha=0.25")[1] == {"policy": "alpha", "options": {"alpha": 0.25}}
    with pytest.raises(SystemExit, match="unknown policy 'nonesuch'"):
        tta.variant_arm("nonesuch:x=1")


def test_the_lora_rate_search_goes_past_the_grid_while_its_top_rate_is_best(tta: Any) -> None:
    grid = [1e-4, 1e-3]
    assert tta.rates_beyond({1e-4: 0.5, 1e-3: 0.6}, grid) == [pytest.approx(2.5e-3)]  # the top is best: go on
    assert tta.rates_beyond({1e-4: 0.6, 1e-3: 0.5}, grid) == []  # the best is inside the grid
    assert tta.rates_beyond({1e-4: 0.6, 1e-3: 0.6}, grid) == []  # a tie goes to the lower rate
    assert tta.rates_beyond({1e-4: 0.5, 1e-3: 0.6, 2.5e-3: 0.7}, grid) == [pytest.approx(6.25e-3)]
    assert tta.rates_beyond({1e-4: 0.5, 1e-3: 0.6, 2.5e-3: 0.55}, grid) == []  # it fell: the search stops
    capped = {1e-4: 0.1, 1e-3: 0.2, 2.5e-3: 0.3, 6.25e-3: 0.4, 1.5625e-2: 0.5}
    assert tta.rates_beyond(capped, grid) == []  # three rates above the grid at most


def test_tuning_tries_rates_above_the_grid_and_keeps_the_best(tta: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    accuracy = {1e-4: 0.5, 1e-3: 0.6, 2.5e-3: 0.7, 6.25e-3: 0.65}
    ran: list[float] = []

    def run_arm(task: Any, arm: str, setting: Any, seed: int, lora_lr: dict[str, float]) -> dict[str, float]:
        lr = lora_lr[arm]
        ran.append(lr)
        return {"accuracy": accuracy[min(accuracy, key=lambda k: abs(k - lr))], "total_seconds": 1.0}

    monkeypatch.setattr(tta, "run_arm", run_arm)
    task = type("T", (), {"name": "t"})()
    out = tta.tune_lora(task, ["lora-qkv-r8"], None, [1e-3, 1e-4])
    assert ran == pytest.approx([1e-4, 1e-3, 2.5e-3, 6.25e-3])  # up while the top was best, stopped when it fell
    assert out["lora-qkv-r8"]["chosen"] == pytest.approx(2.5e-3)
    assert list(out["lora-qkv-r8"]["accuracy_by_lr"]) == [repr(lr) for lr in ran]


def test_the_epoch_table_gives_seconds_between_evaluations_and_the_freezes(
    tta: Any, tmp_path: Path, capsys: Any
) -> None:
    report = {
        "runs": {
            "eager": {"0": {"curve": [[1.0, 0.5], [1.5, 0.6], [2.25, 0.7]], "total_seconds": 2.5}},
            "elastic-default": {
                "1": {"curve": [[2.0, 0.5], [2.25, 0.6]], "total_seconds": 2.4, "frozen_timeline": [[26, 1], [78, 2]]},
                "0": {"curve": [[3.0, 0.5], [4.0, 0.6]], "total_seconds": 4.1, "frozen_timeline": []},
            },
        }
    }
    rows = tta.epoch_table(report).splitlines()[2:]
    assert rows == [
        "| eager | 0 | 1.00, 0.50, 0.75 | 2.50 | - |",
        "| elastic-default | 0 | 3.00, 1.00 | 4.10 | - |",  # seeds in order
        "| elastic-default | 1 | 2.00, 0.25 | 2.40 | 26: 1, 78: 2 |",
    ]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert tta.main(["--epochs-of", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[2:] == rows


def test_the_trainer_reads_fresh_augmentations_every_epoch_as_the_plain_loop_does(
    tta: Any, one_rank_here: None, tmp_path: Path
) -> None:
    """With loader workers, ``elastic-none`` (``ElasticTrainer.fit()``) reads each training sample once per epoch with
    a new random crop and flip, as the plain loop does: its reads are no less varied (on task (b) it ends 2.4 points
    under the plain loop, docs/time_to_accuracy.md; this rules out its augmentation)."""
    import os

    from elastic_pipe import models
    from elastic_pipe.data import load_digits

    epochs, n, pad = 3, 128, 8  # 17 x 17 offsets x 2 flips: a repeated draw of one sample is rare

    class Logged(tta.TensorSet):  # type: ignore[misc,name-defined]
        """TensorSet's crop and flip, appending each read's (process, sample, draw) to ``log`` (set per arm; forked
        workers append to the same file)."""

        log: Path

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            top, left = torch.randint(0, 2 * pad + 1, (2,)).tolist()
            flip = bool(torch.rand(()) < 0.5)
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()} {i} {top} {left} {int(flip)}\n")
            h, w = self.inputs.shape[-2:]
            x = torch.nn.functional.pad(self.inputs[i][None], (pad,) * 4, mode="replicate")[0]
            x = x[:, top : top + h, left : left + w]
            return (x.flip(-1) if flip else x), int(self.targets[i])

    d = load_digits()
    x = (d.inputs - d.inputs.mean()) / d.inputs.std()
    base = models.vit(config="vit-tiny", depth=1, dropout=0.0)
    setting = tta.Setting(torch.device("cpu"), False, 2, "off", False, "views", 2, 64)
    draws: dict[str, dict[int, list[tuple[int, ...]]]] = {}
    for arm in ("plain", "elastic"):
        train = Logged(x[:n], d.labels[:n], pad=pad)
        train.log = tmp_path / f"{arm}.txt"
        task = tta.Task(
            "t",
            "t",
            "vit",
            tta.copies(base),
            train,
            tta.TensorSet(x[1400:], d.labels[1400:]),
            epochs=epochs,
            batch=32,
            lr=1e-3,
        )
        if arm == "plain":
            tta.plain_run(task, task.build(), setting, 1, compiled=False)
        else:
            tta.elastic_run(task, task.build(), setting, 1, tta.ELASTIC_ARMS["elastic-none"])
        per: dict[int, list[tuple[int, ...]]] = {}
        pids = set()
        for line in train.log.read_text().splitlines():
            pid, i, *draw = (int(v) for v in line.split())
            pids.add(pid)
            per.setdefault(i, []).append(tuple(draw))
        assert len(pids) >= 2  # read by worker processes (the trainer's check may read in its own process too)
        draws[arm] = per
    assert sorted(draws["plain"]) == sorted(draws["elastic"]) == list(range(n))
    assert all(len(v) == epochs for v in draws["plain"].values())
    # the trainer reads each sample once per epoch, plus once for its set-up check ([data] check)
    reads = {i: len(v) for i, v in draws["elastic"].items()}
    assert all(r >= epochs + 1 for r in reads.values())
    assert sum(reads.values()) - n * (epochs + 1) <= 2  # and the set-up's boundary example (sample 0) once or twice
    repeated = sum(len(v) - len(set(v)) for v in draws["elastic"].values())
    assert repeated <= 0.05 * n * epochs  # fresh draws every epoch (2 in the 128 x 4 reads expected by chance)


def test_paired_compares_each_arm_with_the_eager_loop_seed_by_seed(tta: Any) -> None:
    def runs(accs: list[float]) -> dict[str, dict[str, float]]:
        return {str(seed): {"accuracy": a} for seed, a in enumerate(accs)}

    report = {
        "runs": {"eager": runs([0.50, 0.60, 0.70]), "arm": runs([0.52, 0.61, 0.69]), "one": {"1": {"accuracy": 0.7}}}
    }
    p = tta.paired(report, "arm")
    assert p["seeds"] == ["0", "1", "2"]
    assert p["diffs"] == pytest.approx([2.0, 1.0, -1.0])
    assert p["mean"] == pytest.approx(2 / 3)
    # Student's t at 97.5% with 2 degrees of freedom is 4.3027; the differences' standard deviation is sqrt(7/3)
    half = 4.302652729911275 * (7 / 3) ** 0.5 / 3**0.5
    assert p["interval"] == pytest.approx([2 / 3 - half, 2 / 3 + half])
    assert tta.paired(report, "one")["interval"] is None  # one shared seed: no interval
    assert tta.paired(report, "missing") is None
    table = tta.paired_table(report)
    assert "| arm | +0.67 | +2.00, +1.00, -1.00 |" in table
    assert "| one | +10.00 | +10.00 | - |" in table
    assert "| eager |" not in table  # the loop is not compared with itself
    assert tta.paired_table({"runs": {"arm": runs([0.5])}}) == ""  # no eager arm: no table


def test_the_elastic_arms_take_the_compile_and_cuda_graph_settings(tta: Any) -> None:
    """``--elastic-compile`` and ``--elastic-graphs`` reach the trainer's ``[train]`` table (a bisect of what only
    the GPU run has: docs/time_to_accuracy.md)."""
    data = tta.TensorSet(torch.zeros(16, 1, 8, 8), torch.zeros(16, dtype=torch.int64))
    task = tta.Task("t", "t", "vit", lambda: None, data, data, epochs=1, batch=8, lr=1e-3)
    default = tta.Setting(torch.device("cpu"), False, 0, "auto", False, "bypass", 1, 64)
    assert tta.task_config(task, default, 0).train.cuda_graphs == "auto"  # the trainer's default
    args = tta.parse_args(["--elastic-compile", "off", "--elastic-graphs", "off"])
    bisect = tta.Setting(torch.device("cpu"), False, 0, args.elastic_compile, False, "bypass", 1, 64,
                         elastic_graphs=args.elastic_graphs)  # fmt: skip
    train = tta.task_config(task, bisect, 0).train
    assert (train.compile, train.cuda_graphs) == ("off", "off")
