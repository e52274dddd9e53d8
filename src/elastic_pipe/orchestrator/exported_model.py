"""A model written by ``elastic-pipe export``, loaded back with the preprocessing its training applied
(:func:`load_exported`, also ``elastic_pipe.load_exported``); the record it reads is :mod:`.persist.exported`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from torch import nn

from elastic_pipe.orchestrator.components import build_model
from elastic_pipe.orchestrator.config import config_from_tables
from elastic_pipe.orchestrator.errors import one_line
from elastic_pipe.orchestrator.persist.exported import ExportError, Preprocess, read_record

__all__ = ["Exported", "load_exported"]


class Exported(NamedTuple):
    """An exported model, ready for inference, and the preprocessing its inputs need."""

    model: nn.Module
    preprocess: Preprocess


def load_exported(path: str | Path, *, model: nn.Module | None = None) -> Exported:
    """Load a model written by ``elastic-pipe export``, with the preprocessing its training applied.

    Args:
        path: the ``.safetensors`` file.
        model: a model to load the weights into (your own model, trained through the API); default: the model the
            export's ``[model]`` table builds.

    Returns:
        ``(model, preprocess)``: the model in eval mode on the CPU, and a :class:`Preprocess` that turns raw
        inputs into what it takes: ``model(preprocess(raw))``.

    Raises:
        ExportError: no inference record, or weights that do not fit the model.
        ConfigError: the recorded ``[model]`` table does not build here (a builder given by import path that
            does not import).
    """
    from safetensors.torch import load_file  # noqa: PLC0415 - optional dependency

    record = read_record(path)
    preprocess = Preprocess(record["preprocess"])
    if model is None:
        tables = {"model": record["model"], "train": record.get("train", {})}
        model = build_model(config_from_tables(tables, source=f"{path} metadata"))
    try:
        model.load_state_dict(load_file(str(path)))
    except RuntimeError as exc:
        first = one_line(str(exc))[:300]
        raise ExportError(
            f"{path}: the weights do not fit the model (trained with a model of your own? pass model=): {first}"
        ) from None
    return Exported(model.eval(), preprocess)
