"""A custom policy needs only what it uses (issue 45): an object with ``num_layers`` and ``propose``, a plain function
``(epoch, step, current) -> int`` and a policy written against the earlier protocol (no ``observe_eval``) each drive
a 2-process run by import path; a policy over the wrong number of units is refused with one line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe import freeze
from elastic_pipe.testing import RankContext, run_distributed
from tiny_vit import model_table

PLUGINS = Path(__file__).parent / "plugins"


def _tables(policy: str) -> dict[str, Any]:
    return {
        "model": model_table(),
        "data": {"eval_fraction": 0.5, "options": {}},
        "train": {"epochs": 3, "global_batch": 32},
        "freeze": {"policy": policy},
        "pipeline": {"pipe_len": 2, "microbatches": 2, "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }


def _run(ctx: RankContext, policy: str) -> list[int]:
    del ctx
    sys.path.insert(0, str(PLUGINS))
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    config = config_from_tables(_tables(policy))
    data = Split(d.inputs[:128], d.labels[:128], d.sample_ids[:128])
    with ElasticTrainer(config, data=data, quiet=True) as trainer:
        result = trainer.fit()
    return [e["frozen_units"] for e in result.epochs]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "policy", ["plug_policy:TwoMembers", "plug_policy:one_unit_per_epoch", "plug_policy:EarlierProtocol"]
)
def test_a_custom_policy_needs_only_what_it_uses(policy: str) -> None:
    results = run_distributed(_run, 2, policy, timeout=180)
    assert results == [[0, 1, 2]] * 2  # the user's policy decided, on both ranks


def test_the_base_class_and_the_adapter_give_the_documented_defaults() -> None:
    class EveryOtherEpoch(freeze.Policy):
        def propose(self, epoch: int, step: int, current: int) -> int:
            return max(current, min(epoch // 2, self.num_layers))

    policy = EveryOtherEpoch(3)
    assert isinstance(policy, freeze.FreezePolicy)
    assert (policy.name, policy.needs_stats, policy.state_dict()) == ("EveryOtherEpoch", False, {})
    assert freeze.frozen_by_epoch(policy, 6) == (0, 0, 1, 1, 2, 2)
    sys.path.insert(0, str(PLUGINS))
    try:
        import plug_policy
    finally:
        sys.path.remove(str(PLUGINS))
    two = freeze.as_policy(plug_policy.TwoMembers(3))
    assert isinstance(two, freeze.FreezePolicy) and two.name == "TwoMembers" and not two.needs_stats
    assert freeze.decide(two, 1, 0, 0) == 1
    earlier = plug_policy.EarlierProtocol(3)
    completed = freeze.as_policy(earlier)
    completed.observe_eval(0.5)  # the default: ignored
    assert freeze.decide(completed, 2, 0, 0) == 2 and completed.state_dict() == {"asked": 1}
    completed.load_state_dict({"asked": 7})
    assert earlier.asked == 7  # the state is the user's object's own
    function = freeze.as_policy(plug_policy.one_unit_per_epoch, 3)
    assert function.name == "one_unit_per_epoch" and freeze.frozen_by_epoch(function, 4) == (0, 1, 2, 2)
    full = plug_policy.OneUnitPerEpoch(3)
    assert freeze.as_policy(full) is full  # a full policy is used as it is
    with pytest.raises(freeze.FreezeError, match=r"lacks \['propose'\]"):
        freeze.as_policy(type("NoPropose", (), {"num_layers": 3})())


def test_a_policy_over_the_wrong_number_of_units_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from elastic_pipe.cli import main
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.errors import ConfigError

    monkeypatch.syspath_prepend(str(PLUGINS))
    import plug_policy

    config = config_from_tables(_tables("never"))
    units = len(build_model(config).unit_ends)
    assert units == 3  # the tiny ViT's three blocks
    with pytest.raises(ConfigError, match=rf"num_layers=12, but the model has {units} freeze units"):
        ElasticTrainer(config, policy=plug_policy.TwoMembers(12))
    path = tmp_path / "run.toml"
    path.write_text(
        '[model]\nname = "vit"\noptions = { preset = "vit-tiny", depth = 3, dim = 16, heads = 2, mlp_dim = 32 }\n'
        '[freeze]\npolicy = "plug_policy:twelve_units"\n[pipeline]\npipe_len = 2\n[launch]\nnproc_per_node = 2\n',
        encoding="utf-8",
    )
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "num_layers=12, but the model has 3 freeze units" in err
