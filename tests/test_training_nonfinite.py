"""Non-finite values: the first NaN or infinite training loss stops the run (``[train] on_nonfinite``), and
``[data] check`` refuses NaN and infinity in the data before the first step.

The loss check runs where the losses already come back to the host (an epoch's end, a fold before a transition, a
checkpoint), so it is exact on its inputs and needs no step of its own: checked directly, then on two gloo ranks:
data that are all NaN with the check off stop at epoch 1 step 1 (or train on with ``"continue"``), and one NaN item,
in tensors in memory or in a map-style dataset, is refused at setup naming the item.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import tiny_vit
from elastic_pipe.orchestrator import ConfigError
from elastic_pipe.orchestrator.config import config_from_tables
from elastic_pipe.orchestrator.data import Split, local_failure
from elastic_pipe.orchestrator.data.data_check import first_nonfinite
from elastic_pipe.orchestrator.errors import NonFiniteLossError, OrchestratorError
from elastic_pipe.orchestrator.report import check_finite_losses
from elastic_pipe.testing import RankContext, run_distributed

SAMPLES = 160  # 128 training samples: 4 steps of 32 per epoch


def test_the_first_non_finite_loss_is_named_by_epoch_and_step() -> None:
    check_finite_losses([0.5, 0.4, 0.3], epoch=2, steps_before=8, steps_per_epoch=4)  # all finite: nothing
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 3, step 2 of 4 \(step 10 of the run\)"):
        check_finite_losses([0.5, math.nan, math.inf], epoch=2, steps_before=8, steps_per_epoch=4)
    with pytest.raises(NonFiniteLossError, match=r"loss is -inf at epoch 1, step 1 of 4 \(step 1 of the run\)"):
        check_finite_losses([-math.inf], epoch=0, steps_before=0, steps_per_epoch=4)
    assert issubclass(NonFiniteLossError, OrchestratorError)


def test_on_nonfinite_is_stop_or_continue() -> None:
    assert config_from_tables({"model": {"name": "vit"}}).train.on_nonfinite == "stop"
    assert (
        config_from_tables({"model": {"name": "vit"}, "train": {"on_nonfinite": "continue"}}).train.on_nonfinite
        == "continue"
    )
    with pytest.raises(ConfigError, match=r"train\.on_nonfinite must be one of stop, continue; got 'ignore'"):
        config_from_tables({"model": {"name": "vit"}, "train": {"on_nonfinite": "ignore"}})


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["input", "label"])
def test_data_check_names_the_first_non_finite_sample_in_memory(poison: float, where: str) -> None:
    inputs = torch.zeros(6, 2, 3)
    labels = torch.zeros(6, 2)  # float labels (a regression): checked too
    ids = torch.tensor([10, 11, 12, 13, 14, 15])
    (inputs if where == "input" else labels)[4].view(-1)[1] = poison
    (inputs if where == "input" else labels)[2].view(-1)[0] = poison
    split = Split(inputs, labels, ids)
    found = first_nonfinite(split)
    assert found is not None and found[0] == 12
    assert f"dataset item 12: its {where} holds a non-finite value ({poison})" in found[1]
    assert local_failure([split], None, 0, 2, scan=True).startswith("12:dataset item 12")
    assert local_failure([split], None, 0, 2, scan=False) == ""  # [data] check = false: not read
    assert first_nonfinite(Split(torch.zeros(3, 2), torch.tensor([0, 1, 2]), torch.arange(3))) is None


# --- on two ranks ---------------------------------------------------------------------------------------------------


def _tables(**train: Any) -> dict[str, Any]:
    return {
        "model": tiny_vit.model_table(),
        "train": {"epochs": 2, "global_batch": 32, "optimizer": "sgd", "lr": 0.05, **train},
        "freeze": {"policy": "never", "options": {}},
        "pipeline": {"pipe_len": 2, "microbatches": 2, "cache": "off"},
        "launch": {"nproc_per_node": 2},
        "log": {"progress": False},
    }


class _NanItem(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The digits as a map-style dataset, item ``bad``'s image NaN at one pixel."""

    def __init__(self, bad: int) -> None:
        from elastic_pipe.data import load_digits

        d = load_digits()
        self.images, self.labels, self.bad = d.inputs[:SAMPLES], d.labels[:SAMPLES], bad

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.images[index].clone()
        if index == self.bad:
            x.view(-1)[5] = math.nan
        return x, int(self.labels[index])


def _cases(ctx: RankContext) -> list[str]:
    from elastic_pipe.data import load_digits
    from elastic_pipe.orchestrator import ElasticTrainer

    d = load_digits()
    nan_all = Split(torch.full_like(d.inputs[:SAMPLES], math.nan), d.labels[:SAMPLES], d.sample_ids[:SAMPLES])
    one_nan = d.inputs[:SAMPLES].clone()
    one_nan[37].view(-1)[3] = math.inf
    runs: list[tuple[dict[str, Any], Any]] = [
        ({**_tables(), "data": {"check": False}}, nan_all),
        ({**_tables(on_nonfinite="continue"), "data": {"check": False}}, nan_all),
        (_tables(), Split(one_nan, d.labels[:SAMPLES], d.sample_ids[:SAMPLES])),
        (_tables(), _NanItem(bad=101)),
    ]
    out = []
    for tables, data in runs:
        try:
            with ElasticTrainer(config_from_tables(tables), data=data, quiet=True) as trainer:
                result = trainer.fit()
            out.append(f"finished: {len(result.losses)} losses, finite {all(map(math.isfinite, result.losses))}")
        except (NonFiniteLossError, ConfigError) as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


@pytest.mark.distributed
def test_a_non_finite_loss_stops_the_run_and_non_finite_data_is_refused() -> None:
    ranks = run_distributed(_cases, 2, timeout=240)
    assert ranks[0] == ranks[1]  # every rank raises the same error
    stop, carry_on, in_memory, dataset = ranks[0]
    assert stop.startswith("NonFiniteLossError: training loss is nan at epoch 1, step 1 of 4 (step 1 of the run)")
    assert carry_on == "finished: 8 losses, finite False"
    assert in_memory.startswith("ConfigError: dataset item 37: its input holds a non-finite value (inf)"), in_memory
    assert dataset.startswith("ConfigError: dataset item 101: its input holds a non-finite value (nan)"), dataset
