"""The argument checks the models' configs and sub-layer modules share: sizes, probabilities, norm epsilons."""

from __future__ import annotations

import math

from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.types import MAX_DIMENSION

__all__ = [
    "MAX_DEPTH",
    "MAX_SEED",
    "check_eps",
    "check_optional_size",
    "check_positive",
    "check_probability",
    "check_seed",
]

#: The largest seed: torch's generators take 64 bits.
MAX_SEED = 2**64 - 1


def check_seed(name: str, seed: object) -> int:
    """``seed`` if it is an int in ``[0, MAX_SEED]``."""
    return CHECK.int(name, seed, hi=MAX_SEED)


#: The most blocks a model has: a model is built block by block in Python, so this bounds the build time (the
#: deepest published transformers have about a hundred).
MAX_DEPTH = 100_000


def check_positive(owner: str, **values: int) -> None:
    """Raise ModelError unless every value is an int in ``[1, MAX_DIMENSION]`` (``depth``: ``[1, MAX_DEPTH]``; a
    wrong type: ModelTypeError)."""
    for key, value in values.items():
        CHECK.int(f"{owner}.{key}", value, lo=1, hi=MAX_DEPTH if key == "depth" else MAX_DIMENSION)


def check_optional_size(owner: str, lo: int = 1, **values: int | None) -> None:
    """Raise ModelError unless every value is None or an int in ``[lo, MAX_DIMENSION]``."""
    for key, value in values.items():
        CHECK.optional_int(f"{owner}.{key}", value, lo=lo, hi=MAX_DIMENSION)


def check_probability(owner: str, **values: float) -> None:
    """Raise ModelError unless every value is a probability in [0, 1)."""
    for key, value in values.items():
        if not 0.0 <= CHECK.number(f"{owner}.{key}", value) < 1.0:
            raise ModelError(f"{owner}.{key} must be in [0, 1), got {value!r}")


def check_eps(owner: str, eps: float) -> None:
    """Raise ModelError unless a norm's ``eps`` is a finite number > 0."""
    if not (math.isfinite(CHECK.number(f"{owner}.eps", eps)) and eps > 0):
        raise ModelError(f"{owner}.eps must be > 0, got {eps!r}")
