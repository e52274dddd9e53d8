"""GPT-style decoder (Radford et al., 2019: GPT-2) at sub-layer granularity.

Sub-layers: ``embed`` (token + learned position embeddings), then ``block{i}.attn`` (causal) and ``block{i}.mlp``
for each pre-LN block, then ``head`` (final LayerNorm and the projection onto the vocabulary). Train with
:func:`elastic_pipe.models.next_token_loss` and the input tokens as the target.

GPT-2 ties the output projection to the token embedding. A pipeline puts the embedding and the head on different
stages, so the decoder here keeps them as two separate matrices (initialized equal when ``tie_init`` is set); its
parameter count is therefore ``vocab_size * dim`` above the published tied count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from elastic_pipe.models._build import build_seeded, resolve_config
from elastic_pipe.models._checks import check_positive
from elastic_pipe.models._transformer import check_attention, check_norm_and_activation, transformer_block
from elastic_pipe.models.layers import LMHead, TokenEmbedding
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends
from elastic_pipe.models.weights import SeededInit

__all__ = ["GPT_PRESETS", "GPTConfig", "gpt_config", "gpt_decoder", "gpt_layers"]


@dataclass(frozen=True, slots=True)
class GPTConfig:
    """Shape of a GPT-style decoder.

    Attributes:
        vocab_size: token vocabulary.
        max_positions: context length (learned absolute positions).
        dim: hidden width.
        depth: number of blocks (the freezable units).
        heads: attention heads; must divide ``dim``.
        mlp_dim: MLP hidden width (4 * dim in GPT-2).
        act: MLP activation (GPT-2 uses the tanh approximation of GELU).
        eps: LayerNorm epsilon.
        dropout: dropout on embeddings and residual branches.
        attention_dropout: dropout on attention probabilities.
        tie_init: initialize the output projection as a copy of the token embedding (GPT-2 style start).
    """

    vocab_size: int
    max_positions: int
    dim: int
    depth: int
    heads: int
    mlp_dim: int
    act: str = "gelu_tanh"
    eps: float = 1e-5
    dropout: float = 0.0
    attention_dropout: float = 0.0
    tie_init: bool = True

    def __post_init__(self) -> None:
        check_positive(
            "GPTConfig",
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            dim=self.dim,
            depth=self.depth,
            heads=self.heads,
            mlp_dim=self.mlp_dim,
        )
        check_attention("GPTConfig", self)
        check_norm_and_activation("GPTConfig", self)


def _gpt2(dim: int, depth: int, heads: int) -> GPTConfig:
    # Published GPT-2 family (Radford et al., Table 2; the released checkpoints' configs).
    return GPTConfig(
        vocab_size=50257,
        max_positions=1024,
        dim=dim,
        depth=depth,
        heads=heads,
        mlp_dim=4 * dim,
        dropout=0.1,
        attention_dropout=0.1,
    )


GPT_PRESETS: dict[str, GPTConfig] = {
    # Small and fast, for tests and CPU examples.
    "gpt-tiny": GPTConfig(vocab_size=64, max_positions=32, dim=32, depth=2, heads=2, mlp_dim=128),
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
}


def gpt_config(name: str, **overrides: Any) -> GPTConfig:
    """The preset ``name`` (see :data:`GPT_PRESETS`) with ``overrides`` applied.

    Raises:
        ModelError: for an unknown preset or field, or an invalid resulting config.
    """
    return resolve_config(name, GPT_PRESETS, GPTConfig, overrides)


def gpt_layers(config: GPTConfig) -> list[tuple[str, nn.Module]]:
    """Freshly constructed (default-initialized) decoder sub-layers in order; :func:`gpt_decoder` seeds them."""
    c = config
    layers: list[tuple[str, nn.Module]] = [
        ("embed", TokenEmbedding(c.vocab_size, c.max_positions, c.dim, dropout=c.dropout))
    ]
    for i in range(c.depth):
        layers += transformer_block(i, c, norm_first=True, causal=True)
    layers.append(("head", LMHead(c.dim, c.vocab_size, final_norm=True, eps=c.eps)))
    return layers


def gpt_decoder(
    config: GPTConfig | str = "gpt-tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    meta: bool = False,
    **overrides: Any,
) -> SubLayerModel:
    """Build a seeded GPT-style decoder.

    Args:
        config: a :class:`GPTConfig` or a preset name from :data:`GPT_PRESETS`.
        seed: initialization seed (the global RNG is not touched).
        dtype: parameter dtype (float64 works on CPU).
        meta: build on the meta device (shapes, no storage) with the seeded recipe as ``sublayer_init``, so each
            rank materializes only what it holds (:func:`~elastic_pipe.models.weights.materialize_sublayers`); the
            values are the same as the whole model's.
        **overrides: config fields to replace, e.g. ``depth=4``.

    Returns:
        A :class:`SubLayerModel`; input ``(B, T)`` token ids, output ``(B, T, vocab_size)`` logits.
    """
    cfg = resolve_config(config, GPT_PRESETS, GPTConfig, overrides)
    # tie_init: the head's projection starts as a copy of the token embedding (drawn by the embedding's generator)
    same_as = {"head.proj.weight": "embed.tokens.weight"} if cfg.tie_init else {}
    return build_seeded(
        lambda: SubLayerModel(gpt_layers(cfg), block_unit_ends(cfg.depth)),
        seed,
        dtype,
        meta=meta,
        init=lambda s: SeededInit(s, same_as=same_as),
    )
