"""Resumes under ``[pipeline] virtual = "auto"`` (issue #43): the layout rule chooses v again for the resumed layout.

The runs of ``tests/test_training_virtual_auto.py`` (GPipe on 2 gloo ranks, the 8 sub-layers of the tiny ViT, 2
units freezing after epoch 0 and halving compressing to one rank: K = 2, v = 4, then K = 1, v = 1) with the
optimizer, data and checkpoints of ``tests/test_training_virtual_resume.py`` (float64 on CPU, helpers imported from
there), checkpointing after every step so that the checkpoint after a resume point records the resumed layout.
An ``"auto"`` run is resumed with ``"auto"`` from inside epoch 0 (v = 4, before the transition) and from the end of
epoch 0 (v = 1, after it), and stopped by ``max_steps`` inside epoch 1 and continued: each ends bit-identical to
the uninterrupted run, in the layouts the rule chose. A fixed v = 2 run's checkpoints resumed with ``"auto"`` are
re-cut to the rule's choice, and an ``"auto"`` run's resumed with v = 2 to 2 stages per rank: each ends
bit-identical to the uninterrupted run of the v it resumes with (as a resume into another v of
``tests/test_training_virtual_resume.py``), which agrees with one process to 1e-10.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from elastic_pipe.orchestrator.dry_run import planned_epochs
from elastic_pipe.testing import RankContext, run_distributed
from test_training_virtual_resume import EPOCH1, STEP0, _config, _final_weights, _fit, _fit_resumed, _load

#: GPipe (which runs any v), halving, 2 units freezing after epoch 0, a checkpoint after every step.
CHANGES: dict[str, object] = {
    "pipeline.schedule": "gpipe",
    "pipeline.compression": "halving",
    "freeze.options": {"schedule": {1: 2}},
    "checkpoint.steps": 1,
}
#: The uninterrupted runs: ``[pipeline] virtual`` of each.
RUNS = {"auto": "auto", "v2": 2}
#: (uninterrupted run, checkpoint, ``[pipeline] virtual`` of the resume): "auto" into "auto", and across.
RESUMES: list[tuple[str, str, int | str]] = [
    ("auto", STEP0, "auto"),
    ("auto", EPOCH1, "auto"),
    ("v2", STEP0, "auto"),
    ("v2", EPOCH1, "auto"),
    ("auto", STEP0, 2),
    ("auto", EPOCH1, 2),
]
#: The run each resume must end as: the uninterrupted one with its v setting.
SAME = {"auto": "auto", 2: "v2"}


def _name(source: str, checkpoint: str, virtual: int | str) -> str:
    return f"{source}-{checkpoint}-v{virtual}"


def _job(ctx: RankContext, tmp: str) -> dict[str, Any]:
    """The uninterrupted runs, an ``"auto"`` run stopped inside epoch 1 and continued, then every resume of
    :data:`RESUMES`, one after the other in one 2-rank job, each in its own directory."""

    root = Path(tmp)
    out = {name: _fit(root / name, v, changes=CHANGES) for name, v in RUNS.items()}
    out["max_steps"] = _fit(root / "stopped", "auto", max_steps=6, changes=CHANGES)  # after step 2 of epoch 1
    out["stopped"] = _fit(root / "stopped", "auto", changes=CHANGES)  # continued in its directory
    for source, checkpoint, v in RESUMES:
        target = root / _name(source, checkpoint, v)
        out[target.name] = _fit_resumed(ctx, root / source, checkpoint, target, v, changes=CHANGES)
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("virtual-auto-resume")
    out: dict[str, Any] = run_distributed(_job, 2, str(tmp), timeout=500)[0]
    return tmp, out


def _layouts(directory: Path, after: str = "") -> dict[str, dict[str, Any]]:
    """The layout each checkpoint of ``directory`` records (``virtual`` filled in when 1), by checkpoint name, for
    those after checkpoint ``after`` (a resumed run's own)."""
    paths = sorted(directory.glob("epoch-*.pt"))
    return {p.stem: {"virtual": 1, **_load(p)["run"]["layout"]} for p in paths if p.stem > after}


def _ends_as(tmp: Path, out: dict[str, Any], run: str, clean: str) -> None:
    """``run`` ends bit-identical to the uninterrupted ``clean``: losses, evaluation and final weights."""
    assert out[run]["losses"] == out[clean]["losses"] and out[run]["eval"] == out[clean]["eval"]
    weights, expected = _final_weights(tmp / run), _final_weights(tmp / clean)
    assert list(weights) == list(expected) and all(torch.equal(weights[k], expected[k]) for k in expected)


@pytest.mark.distributed
def test_an_auto_run_resumed_with_auto_ends_as_the_uninterrupted_run(job: tuple[Path, dict[str, Any]]) -> None:
    tmp, out = job
    planned = planned_epochs(_config(tmp, "auto", CHANGES))
    assert [(e["pipe_len"], e["virtual"]) for e in planned] == [(2, 4), (1, 1)]  # the rule's choice, per layout
    layouts = _layouts(tmp / "auto")
    assert [(v["pipe_len"], v["virtual"]) for v in layouts.values()] == [(2, 4)] * 3 + [(1, 1)] * 5
    assert out["auto"]["losses"][-1] != pytest.approx(out["auto"]["losses"][0], rel=1e-3)  # training did something
    for checkpoint in (STEP0, EPOCH1):
        name = _name("auto", checkpoint, "auto")
        _ends_as(tmp, out, name, "auto")
        assert out[name]["shapes"] == out["auto"]["shapes"] == [(0, 2), (2, 1)]
        # every checkpoint the resumed run wrote (the first, one step after the resume point, holds the layout
        # the resume chose: v = 4 inside epoch 0, v = 1 after the transition) is the uninterrupted run's layout
        resumed = _layouts(tmp / name, checkpoint)
        assert len(resumed) > 2 and all(layouts[c] == layout for c, layout in resumed.items())
    assert _layouts(tmp / _name("auto", STEP0, "auto"))["epoch-0000-step-000003"]["virtual"] == 4
    assert _layouts(tmp / _name("auto", EPOCH1, "auto"))["epoch-0001-step-000001"]["virtual"] == 1
    # stopped by max_steps after step 2 of epoch 1 (v = 1) and continued
    assert len(out["max_steps"]["losses"]) == 6
    _ends_as(tmp, out, "stopped", "auto")
    assert _layouts(tmp / "stopped") == layouts


@pytest.mark.distributed
@pytest.mark.parametrize(("source", "checkpoint", "virtual"), RESUMES[2:])
def test_a_resume_between_a_fixed_v_and_auto_recuts_to_the_new_setting(
    source: str, checkpoint: str, virtual: int | str, job: tuple[Path, dict[str, Any]]
) -> None:
    tmp, out = job
    name, clean = _name(source, checkpoint, virtual), SAME[virtual]
    saved = _layouts(tmp / source)[checkpoint]
    resumed = _layouts(tmp / name, checkpoint)
    # re-cut one step after the resume point: v = 2 <-> 4 in epoch 0, 2 <-> 1 in epoch 1
    assert len(resumed) > 2 and resumed[min(resumed)]["virtual"] != saved["virtual"]
    assert all(_layouts(tmp / clean)[c] == layout for c, layout in resumed.items())  # the new setting's layouts
    _ends_as(tmp, out, name, clean)
    assert out[name]["shapes"] == out[clean]["shapes"]


@pytest.mark.distributed
def test_auto_and_a_fixed_v_train_as_one_process(job: tuple[Path, dict[str, Any]]) -> None:
    """The uninterrupted runs the resumes end as agree with the whole model in one process to 1e-10."""
    tmp, out = job
    one = {"pipeline.pipe_len": 1, "launch.nproc_per_node": 1, "pipeline.virtual": 1}
    (reference,) = run_distributed(_one_process, 1, (str(tmp / "one"), {**CHANGES, **one}), timeout=120)
    assert [v["virtual"] for v in _layouts(tmp / "v2").values()] == [2] * 8
    for run in RUNS:
        assert out[run]["losses"] == pytest.approx(reference["losses"], rel=1e-10, abs=1e-12)
        assert out[run]["eval"] == pytest.approx(reference["eval"], rel=1e-10)


def _one_process(ctx: RankContext, args: tuple[str, dict[str, object]]) -> dict[str, Any]:
    directory, changes = args
    return _fit(Path(directory), 1, changes=changes)
