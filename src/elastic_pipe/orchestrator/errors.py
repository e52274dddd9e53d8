"""The orchestrator's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["ConfigError", "OrchestratorError"]


class OrchestratorError(ElasticPipeError, RuntimeError):
    """Something went wrong while training (a peer disagreed, a checkpoint does not fit, a rank failed)."""


class ConfigError(ElasticPipeError, ValueError):
    """A training configuration that cannot work; raised before any process group is created."""
