"""BERT-style encoder (Devlin et al., NAACL 2019) at sub-layer granularity.

Sub-layers: ``embed`` (token + position + segment-0 embeddings, LayerNorm), then ``block{i}.attn`` and
``block{i}.mlp`` for each block (post-LN as published, or pre-LN), then ``head`` (pooling of the first token or the
mean of real tokens, BERT's tanh pooler, a classifier).

Padded batches: with ``pad_token_id`` set, tokens equal to it are padding; the activation then carries one extra
trailing keep-mask channel (see :mod:`elastic_pipe.models.layers`), so the hidden tensor between sub-layers is
``(B, T, dim + 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from elastic_pipe.models._build import build_seeded, resolve_config
from elastic_pipe.models._checks import check_optional_size, check_positive
from elastic_pipe.models._transformer import check_attention, check_norm_and_activation, transformer_block
from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.layers import (
    ClassifierHead,
    Pooling,
    TokenEmbedding,
)
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends

__all__ = ["BERT_PRESETS", "BertConfig", "bert_config", "bert_encoder", "bert_layers"]


@dataclass(frozen=True, slots=True)
class BertConfig:
    """Shape of a BERT-style encoder with a sequence-classification head.

    Attributes:
        vocab_size: token vocabulary.
        max_positions: longest sequence (learned absolute positions).
        type_vocab_size: segment vocabulary (0 for none; only segment 0 is ever used).
        num_classes: classifier outputs, or ``None`` for a head that returns the pooled vector.
        dim: hidden width.
        depth: number of blocks (the freezable units).
        heads: attention heads; must divide ``dim``.
        mlp_dim: MLP hidden width.
        norm_first: pre-LN blocks (and a final LayerNorm in the head) instead of BERT's post-LN.
        embed_norm: LayerNorm after the embeddings (BERT has one).
        act: MLP activation, a key of ``layers.ACTIVATIONS``.
        eps: LayerNorm epsilon.
        dropout: dropout on embeddings, residual branches and before the classifier.
        attention_dropout: dropout on attention probabilities.
        pad_token_id: id of the padding token, or ``None`` if batches are never padded (no mask channel).
        pooling: ``"first"`` (the ``[CLS]`` token) or ``"mean"`` (mean of real tokens, sentence-transformers style).
        pooler: BERT's dense + tanh pooler after pooling.
        normalize: make the pooled vector unit length (sentence embeddings).
    """

    vocab_size: int
    max_positions: int
    type_vocab_size: int
    num_classes: int | None
    dim: int
    depth: int
    heads: int
    mlp_dim: int
    norm_first: bool = False
    embed_norm: bool = True
    act: str = "gelu"
    eps: float = 1e-12
    dropout: float = 0.0
    attention_dropout: float = 0.0
    pad_token_id: int | None = 0
    pooling: Pooling = "first"
    pooler: bool = True
    normalize: bool = False

    def __post_init__(self) -> None:
        check_positive(
            "BertConfig",
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            dim=self.dim,
            depth=self.depth,
            heads=self.heads,
            mlp_dim=self.mlp_dim,
        )
        if self.num_classes is not None:
            check_positive("BertConfig", num_classes=self.num_classes)
        check_optional_size("BertConfig", 0, type_vocab_size=self.type_vocab_size, pad_token_id=self.pad_token_id)
        check_attention("BertConfig", self)
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ModelError(f"BertConfig.pad_token_id must be in [0, {self.vocab_size}), got {self.pad_token_id!r}")
        if CHECK.str("BertConfig.pooling", self.pooling) not in ("first", "mean"):
            raise ModelError(f"BertConfig.pooling must be 'first' or 'mean', got {self.pooling!r}")
        check_norm_and_activation("BertConfig", self)


def _published(dim: int, depth: int, heads: int) -> BertConfig:
    # Published BERT-base and BERT-large (Devlin et al., section 3) with a 2-class head.
    return BertConfig(
        vocab_size=30522,
        max_positions=512,
        type_vocab_size=2,
        num_classes=2,
        dim=dim,
        depth=depth,
        heads=heads,
        mlp_dim=4 * dim,
        dropout=0.1,
        attention_dropout=0.1,
    )


BERT_PRESETS: dict[str, BertConfig] = {
    # Small and fast, for tests.
    "bert-tiny": BertConfig(
        vocab_size=128, max_positions=32, type_vocab_size=2, num_classes=2, dim=32, depth=2, heads=2, mlp_dim=64
    ),
    "bert-base": _published(768, 12, 12),
    "bert-large": _published(1024, 24, 16),
}


def bert_config(name: str, **overrides: Any) -> BertConfig:
    """The preset ``name`` (see :data:`BERT_PRESETS`) with ``overrides`` applied.

    Raises:
        ModelError: for an unknown preset or field, or an invalid resulting config.
    """
    return resolve_config(name, BERT_PRESETS, BertConfig, overrides)


def bert_layers(config: BertConfig) -> list[tuple[str, nn.Module]]:
    """Freshly constructed (default-initialized) encoder sub-layers in order; :func:`bert_encoder` seeds them."""
    c = config
    masked = c.pad_token_id is not None
    layers: list[tuple[str, nn.Module]] = [
        (
            "embed",
            TokenEmbedding(
                c.vocab_size,
                c.max_positions,
                c.dim,
                type_vocab_size=c.type_vocab_size,
                norm=c.embed_norm,
                eps=c.eps,
                dropout=c.dropout,
                pad_token_id=c.pad_token_id,
            ),
        )
    ]
    for i in range(c.depth):
        layers += transformer_block(i, c, norm_first=c.norm_first, carries_mask=masked)
    head = ClassifierHead(
        c.dim,
        c.num_classes,
        final_norm=c.norm_first,
        eps=c.eps,
        pooling=c.pooling,
        pooler=c.pooler,
        normalize=c.normalize,
        dropout=c.dropout,
        carries_mask=masked,
    )
    layers.append(("head", head))
    return layers


def bert_encoder(
    config: BertConfig | str = "bert-tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    meta: bool = False,
    **overrides: Any,
) -> SubLayerModel:
    """Build a seeded BERT-style encoder.

    Args:
        config: a :class:`BertConfig` or a preset name from :data:`BERT_PRESETS`.
        seed: initialization seed (the global RNG is not touched).
        dtype: parameter dtype (float64 works on CPU).
        meta: build on the meta device (shapes, no storage) with the seeded recipe as ``sublayer_init``, so each
            rank materializes only what it holds (:func:`~elastic_pipe.models.weights.materialize_sublayers`); the
            values are the same as the whole model's.
        **overrides: config fields to replace, e.g. ``num_classes=3``.

    Returns:
        A :class:`SubLayerModel`; input ``(B, T)`` token ids, output ``(B, num_classes)`` logits (or ``(B, dim)``
        pooled vectors when ``num_classes`` is ``None``).
    """
    cfg = resolve_config(config, BERT_PRESETS, BertConfig, overrides)
    return build_seeded(lambda: SubLayerModel(bert_layers(cfg), block_unit_ends(cfg.depth)), seed, dtype, meta=meta)
