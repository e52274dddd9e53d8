"""What the three transformer builders (:mod:`~elastic_pipe.models.bert`, :mod:`~elastic_pipe.models.gpt`,
:mod:`~elastic_pipe.models.vit`) share: validation of their common config fields, and the block of an attention
and an MLP sub-layer.

The checks are two functions rather than one because BertConfig validates its padding and pooling fields between
them; every config keeps the order in which it reports the first bad field.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

from elastic_pipe.models._checks import check_eps, check_probability
from elastic_pipe.models.errors import ModelError
from elastic_pipe.models.layers import AttentionSubLayer, MLPSubLayer, activation

__all__ = ["TransformerConfig", "check_attention", "check_norm_and_activation", "transformer_block"]


class TransformerConfig(Protocol):
    """The fields of a block every transformer config has (``BertConfig``, ``GPTConfig``, ``ViTConfig``): declared
    here so that this module needs none of the config modules, which import it."""

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


def check_attention(owner: str, config: TransformerConfig) -> None:
    """Raise ModelError unless both dropouts are probabilities in [0, 1) and ``heads`` divides ``dim``."""
    check_probability(owner, dropout=config.dropout, attention_dropout=config.attention_dropout)
    if config.dim % config.heads:
        raise ModelError(f"{owner}.heads={config.heads} must divide dim={config.dim}")


def check_norm_and_activation(owner: str, config: TransformerConfig) -> None:
    """Raise ModelError unless the LayerNorm ``eps`` is > 0 and ``act`` names a known activation."""
    check_eps(owner, config.eps)
    activation(config.act)


def transformer_block(
    index: int, config: TransformerConfig, *, norm_first: bool, causal: bool = False, carries_mask: bool = False
) -> list[tuple[str, nn.Module]]:
    """Block ``index`` as its two named sub-layers, ``block{index}.attn`` then ``block{index}.mlp``."""
    attn = AttentionSubLayer(
        config.dim,
        config.heads,
        norm_first=norm_first,
        causal=causal,
        eps=config.eps,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        carries_mask=carries_mask,
    )
    mlp = MLPSubLayer(
        config.dim,
        config.mlp_dim,
        act=config.act,
        norm_first=norm_first,
        eps=config.eps,
        dropout=config.dropout,
        carries_mask=carries_mask,
    )
    return [(f"block{index}.attn", attn), (f"block{index}.mlp", mlp)]
