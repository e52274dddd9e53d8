"""A user's validation set (issue 45): ``[data] eval_dataset = "module:attr"`` and ``ElasticTrainer(eval_data=...)``
evaluate on it and hold nothing out of the training data; without one, ``eval_fraction`` of it is held out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from elastic_pipe.testing import RankContext, run_distributed
from tiny_vit import model_table

PLUGINS = Path(__file__).parent / "plugins"


def _tables(**data: Any) -> dict[str, Any]:
    return {
        "model": model_table(),
        "data": {"dataset": "plug_data:Digits", "check": False, **data},
        "train": {"epochs": 1, "global_batch": 64},
        "freeze": {"policy": "never"},
        "pipeline": {"pipe_len": 2, "microbatches": 2, "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }


def _runs(ctx: RankContext) -> dict[str, Any]:
    del ctx
    sys.path.insert(0, str(PLUGINS))
    from plug_data import Digits

    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables
    from elastic_pipe.orchestrator.data import Split

    d = load_digits()
    runs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "toml": (_tables(eval_dataset="plug_data:held_out_digits"), {}),
        "api": (_tables(), {"data": Digits(320), "eval_data": Digits(160, start=320)}),
        "samples": (
            _tables(),
            {
                "data": Split(d.inputs[:320], d.labels[:320], d.sample_ids[:320]),
                "eval_data": Split(d.inputs[320:480], d.labels[320:480], d.sample_ids[320:480]),
            },
        ),
        "held_out": (_tables(), {}),
    }
    out: dict[str, Any] = {}
    for name, (tables, given) in runs.items():
        with ElasticTrainer(config_from_tables(tables), quiet=True, **given) as trainer:
            result = trainer.fit()
            train, held = trainer.ctx.train_set, trainer.ctx.eval_set
            out[name] = {
                "train": len(train),
                "eval": len(held),
                "samples": result.epochs[0]["samples"],
                "accuracy": result.final_accuracy,
                "train_mean": float(train.inputs.double().mean()) if isinstance(train, Split) else None,
                "eval_labels": held.labels.tolist() if isinstance(held, Split) else None,
            }
    return out


@pytest.mark.distributed
@pytest.mark.slow  # four short runs in one job: about 20 s on 2 shared cores
def test_a_users_validation_set_is_evaluated_on_and_nothing_is_held_out() -> None:
    from elastic_pipe.data import load_digits

    out = run_distributed(_runs, 2, timeout=240)[0]
    for name in ("toml", "api", "samples"):
        assert (out[name]["train"], out[name]["eval"], out[name]["samples"]) == (320, 160, 320), name
        assert out[name]["accuracy"] is not None
    # samples in memory: standardised with the training data's statistics; the evaluation set is the one given
    assert abs(out["samples"]["train_mean"]) < 1e-6
    assert out["samples"]["eval_labels"] == load_digits().labels[320:480].tolist()
    # without one, eval_fraction (0.2) of the 320 is held out, as before
    assert (out["held_out"]["train"], out["held_out"]["eval"], out["held_out"]["samples"]) == (256, 64, 256)


def test_the_validation_set_must_be_of_the_training_datas_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.components import components_from_config, epoch_steps
    from elastic_pipe.orchestrator.errors import ConfigError

    monkeypatch.syspath_prepend(str(PLUGINS))
    config = config_from_tables(_tables(eval_dataset="plug_data:held_out_digits"))
    with pytest.raises(ConfigError, match="must be of one kind"):
        components_from_config(config, data=load_digits())
    with pytest.raises(ConfigError, match=r"eval dataset 'plug_data:nothing_here'.*no attribute"):
        components_from_config(config_from_tables(_tables(eval_dataset="plug_data:nothing_here")))
    # the steps of an epoch count every training sample when the run has its own validation set
    assert epoch_steps(config, 320) == 5 and epoch_steps(config_from_tables(_tables()), 320) == 4
