"""The plain values a training config checks against: the allowed names, the limits and defaults, and the
checks every section runs on its keys (each raises :class:`~elastic_pipe.orchestrator.errors.ConfigError` naming
the key).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.types import ByteSizeError, parse_bytes

__all__ = [
    "AUTOCAST",
    "BACKENDS",
    "CACHE_DTYPES",
    "CACHE_MODES",
    "CACHE_POLICIES",
    "CACHE_TIER_KEYS",
    "COMPILE_MODES",
    "COMPRESSIONS",
    "COST_METRICS",
    "CUDA_GRAPH_MODES",
    "DECIDE_AUTO",
    "DEFAULT_ALPHA",
    "DEFAULT_POLICY",
    "DEFAULT_T0",
    "DTYPES",
    "HOST_KINDS",
    "LR_SCHEDULES",
    "MAX_EPOCHS",
    "MAX_TIMEOUT_S",
    "OPTIMIZERS",
    "SEED_LIMIT",
    "VIRTUAL_AUTO",
    "as_table",
    "check_at_most",
    "check_nonnegative_float",
    "check_nonnegative_int",
    "check_one_of",
    "check_positive_float",
    "check_positive_int",
    "check_string",
    "size_bytes",
]

OPTIMIZERS = ("sgd", "adamw")
LR_SCHEDULES = ("constant", "cosine")
DTYPES = ("float32", "float64")
AUTOCAST = ("none", "bf16")
COMPRESSIONS = ("halving", "memory", "none")
COST_METRICS = ("params", "time")
CACHE_MODES = ("auto", "on", "off")
#: What the activation cache does for a dataset that declares random transforms.
CACHE_POLICIES = ("bypass", "views")
#: ``[pipeline] cache_dtype``: the dtype the activation cache stores entries in ("auto": the prefix output's own).
CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32")
#: Keys of ``[pipeline] cache_tiers``.
CACHE_TIER_KEYS = ("device", "host", "disk", "disk_size", "host_kind", "host_dir")
HOST_KINDS = ("shared", "pinned")
BACKENDS = ("auto", "gloo", "nccl")
COMPILE_MODES = ("auto", "on", "off")
#: ``[pipeline] virtual`` that lets the layout rule choose the stages per rank of every layout.
VIRTUAL_AUTO = "auto"
CUDA_GRAPH_MODES = ("auto", "on", "off")
#: Seeds stay below 2**31 so that they fit a signed 32-bit integer, which every consumer of a seed accepts (numpy's
#: legacy ``RandomState``, a C ``int``, a torch generator, JSON readers in other languages).
SEED_LIMIT = 2**31
#: Longest collective timeout, one day: a larger one only turns a dead peer into a hang nobody notices.
MAX_TIMEOUT_S = 86_400.0
#: Most epochs a run may ask for: far above any real run, low enough to catch a typo (an extra digit or three).
MAX_EPOCHS = 100_000
#: The alpha policy's default: 1/3, the published trade-off (2.83x at 90.78% on CIFAR-100).
DEFAULT_ALPHA = 1 / 3
#: The default freeze policy: ``drift`` with its own defaults (:mod:`elastic_pipe.freeze.drift`): the lower blocks
#: freeze once they move much less than the top one, at most the lower two thirds once that has settled, not before
#: 80% of the run. The accuracy study measured its setting (with the floor at 60%) within 0.5 points of no freezing on
#: both of its tasks while skipping 52% and 34% of the forward+backward compute
#: (``benchmarks/results/freeze_accuracy.json``, docs/freeze.md, "The default policy"); the time-to-accuracy runs moved
#: the floor to 80%.
#: It reads a probe batch while training, so a run under it cannot be planned ahead (plan with a schedule).
DEFAULT_POLICY = "drift"
#: ``[freeze] decide_every`` by default: the policy's own rhythm (:func:`elastic_pipe.orchestrator.components.
#: decision_interval`).
DECIDE_AUTO = "auto"
#: FreezeOut's default ``t0`` (the first unit stops at 70% of the run, the last one trains to the end).
DEFAULT_T0 = 0.7


def size_bytes(value: object, name: str) -> int:
    """A config size in bytes: a byte count or a string like ``"40GiB"`` (:func:`elastic_pipe.types.parse_bytes`).

    Raises:
        ConfigError: naming ``name`` and the value.
    """
    try:
        return parse_bytes(value)  # type: ignore[arg-type]  # parse_bytes refuses any other type itself
    except ByteSizeError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def check_positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_nonnegative_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")


def check_at_most(name: str, value: float, limit: float, limit_name: str, why: str) -> None:
    if value > limit:
        raise ConfigError(f"{name} must be <= {limit_name} = {limit:g} ({why}), got {value!r}")


def check_positive_float(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def check_nonnegative_float(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


def check_one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def check_string(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")


def as_table(name: str, value: object) -> dict[str, object]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name} must be a table of options, got {value!r}")
    return dict(value)
