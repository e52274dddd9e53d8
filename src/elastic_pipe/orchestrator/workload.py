"""What is trained on what: model builders, datasets and the loss, looked up by the names a config uses.

This is glue: the models come from :mod:`elastic_pipe.models`, the data from :mod:`elastic_pipe.data`. A program
that drives the orchestrator directly may pass its own :class:`~elastic_pipe.models.SubLayerModel` and
:class:`Samples` instead (see :func:`elastic_pipe.orchestrator.train`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from elastic_pipe import data, models
from elastic_pipe.orchestrator.config import TrainConfig
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = [
    "DATASETS",
    "MODEL_BUILDERS",
    "Samples",
    "Split",
    "build_model",
    "cross_entropy",
    "load_samples",
    "split_samples",
]


class Samples(Protocol):
    """A dataset held in memory: inputs, labels and a stable id per sample (what the cache keys on)."""

    @property
    def inputs(self) -> torch.Tensor: ...

    @property
    def labels(self) -> torch.Tensor: ...

    @property
    def sample_ids(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class Split:
    """A subset of a dataset held in memory (train or eval part)."""

    inputs: torch.Tensor
    labels: torch.Tensor
    sample_ids: torch.Tensor

    def __post_init__(self) -> None:
        n = self.inputs.shape[0]
        if self.labels.shape[0] != n or self.sample_ids.shape[0] != n:
            raise ConfigError(
                f"dataset tensors disagree on the number of samples: inputs {n}, labels {self.labels.shape[0]}, "
                f"sample_ids {self.sample_ids.shape[0]}"
            )

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


#: Floor of the standard deviation used to standardise inputs (a constant image would divide by zero).
_MIN_STD = 1e-8


def _builder(name: str) -> Callable[..., Any]:
    attribute = {"vit": "vit", "bert": "bert_encoder", "gpt": "gpt_decoder"}[name]
    builder: Callable[..., Any] = getattr(models, attribute)
    return builder


#: Model name in a config -> builder in :mod:`elastic_pipe.models` (resolved lazily).
MODEL_BUILDERS: tuple[str, ...] = ("vit", "bert", "gpt")
#: Dataset name in a config -> loader in :mod:`elastic_pipe.data`.
DATASETS: tuple[str, ...] = ("digits", "mnist5k")


def build_model(config: TrainConfig) -> torch.nn.Module:
    """Build the config's model, seeded with ``config.seed`` and in ``config.dtype``, on the CPU.

    ``model_options`` may hold ``preset`` (a preset name of the builder) and any field overrides.

    Raises:
        ConfigError: for an unknown model name (listing the valid ones).
    """
    if config.model not in MODEL_BUILDERS:
        raise ConfigError(f"unknown model {config.model!r}; expected one of {', '.join(MODEL_BUILDERS)}")
    options = dict(config.model_options)
    preset = options.pop("preset", None)
    dtype = getattr(torch, config.dtype)
    builder = _builder(config.model)
    args = () if preset is None else (preset,)
    model: torch.nn.Module = builder(*args, seed=config.seed, dtype=dtype, **options)
    return model


def load_samples(config: TrainConfig) -> Samples:
    """Load the config's dataset (inputs cast to the config's dtype).

    Raises:
        ConfigError: for an unknown dataset name (listing the valid ones).
    """
    loaders: dict[str, Callable[[], Samples]] = {"digits": data.load_digits, "mnist5k": data.load_mnist5k}
    if config.dataset not in loaders:
        raise ConfigError(f"unknown dataset {config.dataset!r}; expected one of {', '.join(DATASETS)}")
    return loaders[config.dataset]()


def eval_count(n: int, eval_fraction: float) -> int:
    """How many of ``n`` samples :func:`split_samples` holds out for evaluation (at least one)."""
    return max(1, round(n * eval_fraction))


def split_samples(samples: Samples, eval_fraction: float, seed: int, dtype: torch.dtype) -> tuple[Split, Split]:
    """Split into a training and an evaluation part with a seeded permutation (same on every rank).

    Floating inputs are cast to ``dtype`` and standardised with the training part's mean and standard deviation
    (a transformer initialised with small weights barely sees raw [0, 1] pixels); integer inputs (token ids) are
    left alone.
    """
    n = int(samples.inputs.shape[0])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_eval = eval_count(n, eval_fraction)
    inputs = samples.inputs
    if inputs.is_floating_point():
        train_inputs = inputs[order[n_eval:]].double()
        mean, std = train_inputs.mean(), train_inputs.std()
        inputs = ((inputs.double() - mean) / std.clamp_min(_MIN_STD)).to(dtype)

    def part(idx: torch.Tensor) -> Split:
        idx = idx.sort().values
        return Split(inputs[idx], samples.labels[idx], samples.sample_ids[idx])

    return part(order[n_eval:]), part(order[:n_eval])


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy for classification logits ``(B, C)`` or per-token logits ``(B, T, V)``."""
    # Low-precision logits (bf16 autocast) are upcast: the softmax over a vocabulary loses too much in bf16.
    if output.dtype in (torch.bfloat16, torch.float16):
        output = output.float()
    if output.dim() == 3:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)
