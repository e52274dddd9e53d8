"""Validation shared by the transformer configs (:class:`BertConfig`, :class:`GPTConfig`, :class:`ViTConfig`).

Each config runs its own checks first and these in between, so a config with one bad field names that field;
the two helpers are separate because the encoder checks its padding and pooling fields between them.
"""

from __future__ import annotations

from elastic_pipe.models._build import check_probability
from elastic_pipe.models.errors import ModelError
from elastic_pipe.models.layers import activation

__all__ = ["check_attention", "check_norm_and_activation"]


def check_attention(owner: str, *, dim: int, heads: int, dropout: float, attention_dropout: float) -> None:
    """Raise ModelError unless both dropouts are probabilities in [0, 1) and ``heads`` divides ``dim``."""
    check_probability(owner, dropout=dropout, attention_dropout=attention_dropout)
    if dim % heads:
        raise ModelError(f"{owner}.heads={heads} must divide dim={dim}")


def check_norm_and_activation(owner: str, *, eps: float, act: str) -> None:
    """Raise ModelError unless the LayerNorm ``eps`` is > 0 and ``act`` names a known activation."""
    if not eps > 0:
        raise ModelError(f"{owner}.eps must be > 0, got {eps!r}")
    activation(act)
