"""The integrations' exception family."""

from __future__ import annotations

from elastic_pipe.types import ElasticPipeError

__all__ = ["IntegrationError"]


class IntegrationError(ElasticPipeError, ValueError):
    """Bad input to a trainer callback: a model whose blocks cannot be found, a policy of the wrong size, a
    checkpoint without the callback's state, a cache asked for under random augmentation.

    Messages name the offending value and what was expected.
    """
