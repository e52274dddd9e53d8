"""The custom-policy example: its policy satisfies the protocol, plugs into the registry, and resumes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from elastic_pipe.freeze import POLICIES, FreezePolicy, LayerStats, decide, make_policy, register_policy
from elastic_pipe.freeze.drift import DEFAULT_SETTLE_AFTER
from script_module import load_script

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_freeze_policy.py"


def _load() -> ModuleType:
    return load_script(EXAMPLE)


def test_example_policy_plugs_in_and_resumes() -> None:
    example = _load()
    register_policy("plateau-test", example.PlateauFreeze)
    try:
        policy = make_policy("plateau-test", 3, ratio=0.5)
        assert isinstance(policy, FreezePolicy)
        assert (policy.name, policy.needs_stats) == ("plateau", True)
        policy.observe_eval(0.25)  # ignored
        policy.observe(LayerStats((1.0,) * 3, (4.0, 2.0, 2.0), 1))
        assert decide(policy, 1, 10, 0) == 0  # peak 4, latest 4
        policy.observe(LayerStats((1.0,) * 3, (1.9, 0.5, 2.0), 1))
        snapshot = json.loads(json.dumps(policy.state_dict()))
        resumed = make_policy("plateau-test", 3, ratio=0.5)
        resumed.load_state_dict(snapshot)
        assert decide(policy, 2, 20, 0) == decide(resumed, 2, 20, 0) == 1  # 1.9 < 0.5 * 4
        assert decide(policy, 2, 21, 1) == 1  # no new observation, no new decision
    finally:
        POLICIES.pop("plateau-test", None)


def test_the_default_policy_example_freezes_the_lower_two_thirds_only_after_the_settle_floor(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("drift_default_policy", EXAMPLE.parent / "drift_default_policy.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "runs.json"
    # 6 epochs: at 4 the pre-trained run never froze on one 2-core machine (its top block had not settled by the
    # run's end; the runs' numbers depend on the CPU's kernels and threads)
    epochs = 6
    assert example.main(["--epochs", str(epochs), "--pretrain-epochs", "1", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())
    assert set(runs) == {"pre-trained on 0-4", "initial weights"}
    for run in runs.values():
        steps, timeline = run["steps"], run["timeline"]
        assert run["decide_every"] == (steps // epochs) // 4  # four decision points per epoch
        assert [f for _, f in timeline] == sorted({f for _, f in timeline})  # monotone, one entry per change
        # the settle test waits for its floor (80% of the run)
        assert all(f < 4 for s, f in timeline if s < DEFAULT_SETTLE_AFTER * steps)
        assert timeline and timeline[-1][1] == 4  # and then freezes what is left below the cap (6 blocks: 4)
        assert 0.0 <= run["accuracy"] <= 1.0
