"""What an exported model needs at inference: the record a checkpoint and an export keep, and the preprocessing it
describes (loading a model back is :mod:`~elastic_pipe.orchestrator.exported_model`).

A checkpoint keeps an ``inference`` record beside the run's state (:func:`inference_record`): the ``[model]``
table and the ``[train]`` dtype and seed the model is built from, and how the trainer turned raw inputs into what
the model saw:

* ``{"kind": "standardize", "mean": m, "std": s, "dtype": "float32"}``: floating inputs held in memory (the
  built-in image datasets, a user's samples) were standardised with the training part's statistics
  (:class:`~elastic_pipe.orchestrator.data.Standardization`);
* ``{"kind": "tokenize", "tokenizer": "minilm", "directory": DIR or None, "max_tokens": T}``: texts were
  tokenised to ``T`` ids by the MiniLM tokenizer (``directory`` ``None``: the bundled one) - the ``bbcnews``
  dataset;
* ``{"kind": "none"}``: inputs reached the model as the data gave them (integer inputs held in memory, a
  map-style dataset, whose own transforms are its business).

``elastic-pipe export`` writes the record into the safetensors file's metadata under :data:`METADATA_KEY` (JSON),
and :func:`~elastic_pipe.orchestrator.exported_model.load_exported` reads it back::

    import elastic_pipe
    from elastic_pipe.data import load_digits

    model, preprocess = elastic_pipe.load_exported("model.safetensors")
    logits = model(preprocess(load_digits().inputs[:8]))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from elastic_pipe.orchestrator.data import Standardization
from elastic_pipe.orchestrator.errors import OrchestratorError, one_line

if TYPE_CHECKING:
    from elastic_pipe.orchestrator.config import TrainConfig

__all__ = ["METADATA_KEY", "ExportError", "Preprocess", "inference_record", "read_record"]

#: The safetensors metadata key under which an export keeps its inference record (a JSON string).
METADATA_KEY = "elastic_pipe.inference"
#: What a preprocessing record's ``kind`` may be.
KINDS = ("standardize", "tokenize", "none")


class ExportError(OrchestratorError):
    """An exported file that cannot be loaded as a model (no inference record, weights of another model)."""


def inference_record(config: TrainConfig, train_set: object, data: object) -> dict[str, object]:
    """What inference needs to rebuild the model of ``config`` and prepare raw inputs as training did.

    Args:
        config: the run's config (its ``[model]`` table, ``[train] dtype`` and ``seed``).
        train_set: the training split: a :class:`~elastic_pipe.orchestrator.data.Split` records its
            standardisation.
        data: the run's data as given: a tokenised text dataset records its tokenizer (``tokenizer``).

    Returns:
        Plain data (strings, numbers, dicts): ``{"model", "train", "preprocess"}``.
    """
    standardization = getattr(train_set, "standardization", None)
    tokenizer = getattr(data, "tokenizer", None)
    preprocess: dict[str, object]
    if isinstance(standardization, Standardization):
        preprocess = {
            "kind": "standardize",
            "mean": standardization.mean,
            "std": standardization.std,
            "dtype": config.train.dtype,
        }
    elif isinstance(tokenizer, dict):
        preprocess = {"kind": "tokenize", **tokenizer}
    else:
        preprocess = {"kind": "none"}
    return {
        # plain data only (a TOML date would not survive torch.load(weights_only=True) or the JSON metadata)
        "model": {
            "name": config.model.name,
            "options": json.loads(json.dumps(dict(config.model.options), default=str)),
        },
        "train": {"dtype": config.train.dtype, "seed": config.train.seed},
        "preprocess": preprocess,
    }


class Preprocess:
    """Raw inputs to model inputs, as the trainer prepared them (callable).

    * ``standardize``: a float tensor (or array) shaped like the dataset's inputs - for the built-in image
      datasets, what :func:`elastic_pipe.data.load_digits` gives (``N x 1 x H x W`` in [0, 1]) - standardised
      with the training statistics and cast to the training dtype, the same bits as in training;
    * ``tokenize``: a text or a list of texts to ``(N, max_tokens)`` token ids;
    * ``none``: the inputs as they are (as a tensor).

    Attributes:
        spec: the preprocessing record (see the module docstring).

    Raises:
        ExportError: a record of an unknown kind.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        kind = spec.get("kind")
        if kind not in KINDS:
            raise ExportError(f"unknown preprocessing kind {kind!r}; expected one of {', '.join(KINDS)}")
        self.spec = dict(spec)

    def __repr__(self) -> str:
        return f"Preprocess({self.spec})"

    def __call__(self, raw: Any) -> torch.Tensor:
        """Model inputs for ``raw`` (see the class docstring)."""
        kind = self.spec["kind"]
        if kind == "tokenize":
            from elastic_pipe.models import minilm_tokenize  # noqa: PLC0415 - only text needs the tokenizer

            texts = [raw] if isinstance(raw, str) else list(raw)
            if not all(isinstance(t, str) for t in texts):
                raise ExportError("this model's preprocess takes a text or a list of texts")
            length = int(self.spec["max_tokens"])
            return minilm_tokenize(texts, length, pad_to=length, directory=self.spec.get("directory"))
        x = torch.as_tensor(raw)
        if kind == "standardize":
            dtype = getattr(torch, str(self.spec["dtype"]))
            return Standardization(float(self.spec["mean"]), float(self.spec["std"])).apply(x, dtype)
        return x


def read_record(path: str | Path) -> dict[str, Any]:
    """The inference record of the safetensors file ``path``.

    Raises:
        ExportError: the file is not safetensors, or was exported without a record (from an older checkpoint).
    """
    from safetensors import safe_open  # noqa: PLC0415 - optional dependency

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for unreadable files
        raise ExportError(f"cannot read {path} as safetensors: {one_line(str(exc))[:200]}") from None
    text = meta.get(METADATA_KEY)
    if text is None:
        raise ExportError(
            f"{path} has no {METADATA_KEY!r} metadata (exported from a checkpoint written before it was kept): "
            "export again from a new checkpoint, or load the weights into your model with "
            "safetensors.torch.load_file"
        )
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ExportError(f"{path}: {METADATA_KEY!r} metadata is not JSON: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("preprocess"), dict):
        raise ExportError(f"{path}: {METADATA_KEY!r} metadata lacks a preprocess record: {text[:200]}")
    return record
