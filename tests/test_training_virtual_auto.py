"""``[pipeline] virtual = "auto"`` (issue #43): v changes at a transition and the run still computes what a fixed
run computes.

GPipe on 2 gloo ranks, the 8 sub-layers of the tiny ViT: the layout rule starts with K = 2 and the simulated bubble
makes v = 4 the fastest (8 stages, one sub-layer each); after 2 units freeze, halving compresses to K = 1, where no
bubble is left and v = 1 wins. The reference is one process training the whole model with the same freezes
(float64 on CPU: the losses agree to 1e-10). Helpers from ``tests/test_training_interleaved.py``.
"""

from __future__ import annotations

import pytest

from elastic_pipe.orchestrator.dry_run import planned_epochs
from elastic_pipe.testing import run_distributed
from test_training_interleaved import STEPS, _config, _run


@pytest.mark.distributed
def test_auto_changes_v_at_a_transition_and_trains_as_one_process() -> None:
    config = _config({1: 2}, pipe_len=2, virtual="auto", schedule="gpipe", compression="halving")
    planned = planned_epochs(config)
    assert [(e["pipe_len"], e["virtual"]) for e in planned] == [(2, 4), (1, 1)]  # the rule's choice, per layout
    (reference,) = run_distributed(_run, 1, {"fixed": _config({1: 2})}, timeout=120)
    results = run_distributed(_run, 2, {"auto": config}, timeout=180)
    run, fixed = results[0]["auto"], reference["fixed"]
    assert [(e["frozen_units"], e["pipe_len"], e["replicas"]) for e in run["epochs"]] == [(0, 2, 1), (2, 1, 2)]
    (transition,) = run["transitions"]
    assert (transition["virtual"], transition["boundaries"]) == (1, [5, 8])  # v went from 4 to 1
    assert transition["boundaries"] == planned[1]["boundaries"]
    assert len(run["losses"]) == len(fixed["losses"]) == 2 * STEPS
    assert run["losses"] == pytest.approx(fixed["losses"], rel=1e-10, abs=1e-12)
    assert run["final_eval_loss"] == pytest.approx(fixed["final_eval_loss"], rel=1e-10)
    assert results[1]["auto"]["losses"] == run["losses"]  # every rank reports the same numbers
