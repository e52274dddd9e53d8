"""The model builders and datasets a config may name, and building them (each name looked up by
:func:`~.lookup.resolve`: a registry name, or ``"package.module:attribute"``).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from elastic_pipe import data as edata
from elastic_pipe import models
from elastic_pipe.orchestrator.components.lookup import resolve
from elastic_pipe.orchestrator.data import Data, as_data, bbcnews
from elastic_pipe.orchestrator.errors import ConfigError
from elastic_pipe.types import ElasticPipeError

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["DATASETS", "MODEL_BUILDERS", "build_model", "load_eval_samples", "load_samples"]


#: Model name in a config -> builder in :mod:`elastic_pipe.models`.
MODEL_BUILDERS: dict[str, Callable[..., models.SubLayerModel]] = {
    "vit": models.vit,
    "bert": models.bert_encoder,
    "gpt": models.gpt_decoder,
    "minilm": models.load_minilm,  # the pretrained all-MiniLM-L6-v2; options: num_classes (the new head)
}

#: Datasets that need a model's tokenizer, which :mod:`elastic_pipe.data` (a primitive) may not import.
_TOKENISED_DATASETS: dict[str, Callable[..., object]] = {
    "bbcnews": bbcnews,  # a tokenised map-style dataset (orchestrator.data.text_data)
}

#: Dataset name in a config -> loader: a read-through view of the one registry, :data:`elastic_pipe.data.DATASETS`
#: (a dataset added there is a config name at once), plus the tokenised text datasets above.
DATASETS: Mapping[str, Callable[..., object]] = ChainMap(
    _TOKENISED_DATASETS,
    cast("dict[str, Callable[..., object]]", edata.DATASETS),  # read only: a ChainMap writes to its first map
)


def build_model(config: TrainConfig, *, meta: bool = False) -> models.SubLayerModel:
    """Build the config's model, seeded with ``train.seed`` and in ``train.dtype``, on the CPU (or the meta device).

    A built-in builder gets ``options`` (``preset`` is its first positional argument) plus ``seed``, ``dtype`` and
    ``meta``; a builder given by import path gets ``options`` alone, under a seeded global generator, and its model
    is cast (it may build on the meta device itself and set ``sublayer_init``, see
    :mod:`elastic_pipe.models.weights`).

    Args:
        config: the run's config.
        meta: built-in models only: build on the meta device with their recipe (``sublayer_init``), so that each
            rank materializes only what it holds; the values are those of ``meta=False``, sub-layer by sub-layer.
            What the trainer builds.

    Raises:
        ConfigError: an unknown model name, bad options, or a builder that did not return a module.
    """
    spec = config.model.name
    builder = resolve(spec, MODEL_BUILDERS, "model")
    options = dict(config.model.options)
    dtype = getattr(torch, config.train.dtype)
    try:
        if spec in MODEL_BUILDERS:
            preset = options.pop("preset", None)
            args = () if preset is None else (preset,)
            model = builder(*args, seed=config.train.seed, dtype=dtype, meta=meta, **options)
        else:
            torch.manual_seed(config.train.seed)
            model = builder(**options)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"model {spec!r} with options {dict(config.model.options)}: {exc}") from None
    if not isinstance(model, nn.Module) or not hasattr(model, "unit_ends"):
        raise ConfigError(f"model {spec!r} built {type(model).__name__}, expected a SubLayerModel (with unit_ends)")
    return model.to(dtype)


def load_samples(config: TrainConfig) -> Data:
    """Load the config's dataset: a built-in one by name, or the result of ``factory(**options)`` by import path
    (samples held in memory, or a map-style dataset, which is not read here).

    Raises:
        ConfigError: an unknown dataset name, or something that is neither samples nor a dataset.
    """
    spec = config.data.dataset
    loader = resolve(spec, DATASETS, "dataset")
    try:
        loaded = loader(**config.data.options)  # built-ins take options too (bbcnews: max_tokens)
        return as_data(loaded)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"dataset {spec!r}: {exc}") from None


def load_eval_samples(config: TrainConfig) -> Data | None:
    """The user's validation set that ``[data] eval_dataset`` names (``None`` when it names none): a dataset
    object as it is, or what a function returns when called with ``[data] eval_options``.

    Raises:
        ConfigError: an unknown name, an import path that does not import, or something that is no data.
    """
    spec = config.data.eval_dataset
    if not spec:
        return None
    found = resolve(spec, DATASETS, "eval dataset")
    try:
        # a function or a Dataset class is called with the options; a dataset object is taken as it is
        is_data = not isinstance(found, type) and (hasattr(found, "__getitem__") or hasattr(found, "inputs"))
        loaded = found if is_data else found(**config.data.eval_options)
        return as_data(loaded)
    except (ElasticPipeError, TypeError) as exc:
        raise ConfigError(f"eval dataset {spec!r}: {exc}") from None
