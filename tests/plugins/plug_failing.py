"""A model builder that fails on rank 1 only, for the tests of how a failed worker is reported."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from elastic_pipe import models
from elastic_pipe.orchestrator.errors import OrchestratorError


def rank_one_fails(**options: Any) -> nn.Module:
    """A tiny ViT, except in the worker with ``RANK=1`` (the parent's preflight has no RANK and builds it)."""
    if os.environ.get("RANK") == "1":
        raise OrchestratorError("rank one refuses\nto build its model")
    return models.vit(config="vit-tiny", **options)


def fail_on_rank_one(value: int) -> int:
    """An entrypoint for ``launch``: returns ``value`` on every rank but 1, which raises."""
    if os.environ.get("RANK") == "1":
        raise OrchestratorError(f"rank 1 cannot handle {value}")
    return value
