"""The trainer's parts read before they exist: each property names what to call first (no ``None`` leaks out)."""

from __future__ import annotations

import pytest

from elastic_pipe import models
from elastic_pipe.orchestrator import ElasticTrainer, OrchestratorError, config_from_tables


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ("ctx", r"not set up: call fit\(\), start\(\) or setup\(\) first"),
        ("prefix", r"not set up: call fit\(\), start\(\) or setup\(\) first"),
        ("state", r"no layout yet: call fit\(\) or start\(\) first"),
        ("stage", r"no stage yet: call fit\(\) or start\(\) first"),
    ],
)
def test_a_part_read_before_the_trainer_holds_it_raises_what_to_call(part: str, message: str) -> None:
    config = config_from_tables({"model": {"name": "vit", "options": {"depth": 2}}, "train": {"global_batch": 8}})
    trainer = ElasticTrainer(config, model=models.vit(depth=2), quiet=True)
    with pytest.raises(OrchestratorError, match=message):
        getattr(trainer, part)
