"""What the three transformer builders (:mod:`~elastic_pipe.models.bert`, :mod:`~elastic_pipe.models.gpt`,
:mod:`~elastic_pipe.models.vit`) share: validation of their common config fields, and the block of an attention
and an MLP sub-layer.

The checks are two functions rather than one because BertConfig validates its padding and pooling fields between
them; every config keeps the order in which it reports the first bad field.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

from elastic_pipe.models._build import check_probability
from elastic_pipe.models.errors import ModelError
from elastic_pipe.models.layers import AttentionSubLayer, MLPSubLayer, activation

__all__ = ["BlockShape", "check_attention", "check_norm_and_activation", "transformer_block"]


class BlockShape(Protocol):
    """The config fields a transformer block is built from (BertConfig, GPTConfig and ViTConfig have them)."""

    @property
    def dim(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def mlp_dim(self) -> int: ...
    @property
    def act(self) -> str: ...
    @property
    def eps(self) -> float: ...
    @property
    def dropout(self) -> float: ...
    @property
    def attention_dropout(self) -> float: ...


def check_attention(owner: str, shape: BlockShape) -> None:
    """Raise ModelError unless both dropouts are probabilities in [0, 1) and ``heads`` divides ``dim``."""
    check_probability(owner, dropout=shape.dropout, attention_dropout=shape.attention_dropout)
    if shape.dim % shape.heads:
        raise ModelError(f"{owner}.heads={shape.heads} must divide dim={shape.dim}")


def check_norm_and_activation(owner: str, shape: BlockShape) -> None:
    """Raise ModelError unless the LayerNorm ``eps`` is > 0 and ``act`` names a known activation."""
    if not shape.eps > 0:
        raise ModelError(f"{owner}.eps must be > 0, got {shape.eps!r}")
    activation(shape.act)


def transformer_block(
    index: int, shape: BlockShape, *, norm_first: bool, causal: bool = False, carries_mask: bool = False
) -> list[tuple[str, nn.Module]]:
    """Block ``index`` as its two named sub-layers, ``block{index}.attn`` then ``block{index}.mlp``."""
    attn = AttentionSubLayer(
        shape.dim,
        shape.heads,
        norm_first=norm_first,
        causal=causal,
        eps=shape.eps,
        dropout=shape.dropout,
        attention_dropout=shape.attention_dropout,
        carries_mask=carries_mask,
    )
    mlp = MLPSubLayer(
        shape.dim,
        shape.mlp_dim,
        act=shape.act,
        norm_first=norm_first,
        eps=shape.eps,
        dropout=shape.dropout,
        carries_mask=carries_mask,
    )
    return [(f"block{index}.attn", attn), (f"block{index}.mlp", mlp)]
