"""The models package's exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["ModelError"]


class ModelError(ElasticPipeError, ValueError):
    """A model, configuration or adapter input is not what the models package expects.

    Messages name the bad value and what was expected (e.g. an unknown preset lists the known ones).
    """
