"""The smallest ViT the training tests run (3 blocks of width 16 on the 8x8 digits): one table for every test."""

from __future__ import annotations

from typing import Any

#: ``[model] options`` of the tiny ViT.
OPTIONS: dict[str, Any] = {"preset": "vit-tiny", "depth": 3, "dim": 16, "heads": 2, "mlp_dim": 32}


def model_table(**options: Any) -> dict[str, Any]:
    """``[model]`` of the tiny ViT, ``options`` over its own (a new dict each call: callers may change it)."""
    return {"name": "vit", "options": {**OPTIONS, **options}}
