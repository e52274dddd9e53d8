"""Vision Transformer (Dosovitskiy et al., ICLR 2021) at sub-layer granularity.

Sub-layers: ``embed`` (patch convolution, class token, positions), then ``block{i}.attn`` and ``block{i}.mlp`` for
each pre-LN block, then ``head`` (final LayerNorm and a linear classifier on the class token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from elastic_pipe.models._build import build_seeded, resolve_config
from elastic_pipe.models._checks import check_positive
from elastic_pipe.models._transformer import check_attention, check_norm_and_activation, transformer_block
from elastic_pipe.models.errors import ModelError
from elastic_pipe.models.layers import ClassifierHead, PatchEmbedding
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends

__all__ = ["VIT_PRESETS", "ViTConfig", "vit", "vit_config"]


@dataclass(frozen=True, slots=True)
class ViTConfig:
    """Shape of a Vision Transformer.

    Attributes:
        image_size: input height and width (square images).
        patch_size: side of a square patch; must divide ``image_size``.
        in_channels: input channels (1 for the 8x8 digits, 3 for RGB).
        num_classes: classifier outputs.
        dim: hidden width.
        depth: number of transformer blocks (the freezable units).
        heads: attention heads; must divide ``dim``.
        mlp_dim: MLP hidden width.
        dropout: dropout after embeddings, attention output and MLP.
        attention_dropout: dropout on attention probabilities.
        eps: LayerNorm epsilon.
        act: MLP activation, a key of ``layers.ACTIVATIONS``.
    """

    image_size: int
    patch_size: int
    in_channels: int
    num_classes: int
    dim: int
    depth: int
    heads: int
    mlp_dim: int
    dropout: float = 0.0
    attention_dropout: float = 0.0
    eps: float = 1e-6
    act: str = "gelu"

    def __post_init__(self) -> None:
        check_positive(
            "ViTConfig",
            image_size=self.image_size,
            patch_size=self.patch_size,
            in_channels=self.in_channels,
            num_classes=self.num_classes,
            dim=self.dim,
            depth=self.depth,
            heads=self.heads,
            mlp_dim=self.mlp_dim,
        )
        if self.image_size % self.patch_size:
            raise ModelError(f"ViTConfig.patch_size={self.patch_size} must divide image_size={self.image_size}")
        check_attention("ViTConfig", self)
        check_norm_and_activation("ViTConfig", self)

    @property
    def seq_len(self) -> int:
        """Tokens per image: one per patch plus the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1


VIT_PRESETS: dict[str, ViTConfig] = {
    # The CPU demo model: 8x8 single-channel digits, 2x2 patches (16 tokens + class token).
    "vit-tiny": ViTConfig(
        image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=64, depth=6, heads=4, mlp_dim=128
    ),
    # Published ViT-B/16 and ViT-L/16 (Dosovitskiy et al., Table 1) at 224x224 on ImageNet-1k.
    "vit-b16": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=768, depth=12, heads=12, mlp_dim=3072
    ),
    "vit-l16": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=1024, depth=24, heads=16, mlp_dim=4096
    ),
}


def vit_config(name: str, **overrides: Any) -> ViTConfig:
    """The preset ``name`` (see :data:`VIT_PRESETS`) with ``overrides`` applied, e.g. ``num_classes=100``.

    Raises:
        ModelError: for an unknown preset or field, or an invalid resulting config.
    """
    return resolve_config(name, VIT_PRESETS, ViTConfig, overrides)


def vit_layers(config: ViTConfig) -> list[tuple[str, nn.Module]]:
    """Freshly constructed (default-initialized) ViT sub-layers in order; :func:`vit` seeds them."""
    c = config
    layers: list[tuple[str, nn.Module]] = [
        ("embed", PatchEmbedding(c.image_size, c.patch_size, c.in_channels, c.dim, c.dropout))
    ]
    for i in range(c.depth):
        layers += transformer_block(i, c, norm_first=True)
    layers.append(("head", ClassifierHead(c.dim, c.num_classes, final_norm=True, eps=c.eps, pooling="first")))
    return layers


def vit(
    config: ViTConfig | str = "vit-tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    meta: bool = False,
    **overrides: Any,
) -> SubLayerModel:
    """Build a seeded Vision Transformer.

    Args:
        config: a :class:`ViTConfig` or a preset name from :data:`VIT_PRESETS`.
        seed: initialization seed; the same seed gives the same weights (the global RNG is not touched).
        dtype: parameter dtype (float64 works on CPU).
        meta: build on the meta device (shapes, no storage) with the seeded recipe as ``sublayer_init``, so each
            rank materializes only what it holds (:func:`~elastic_pipe.models.weights.materialize_sublayers`); the
            values are the same as the whole model's.
        **overrides: config fields to replace, e.g. ``depth=4``.

    Returns:
        A :class:`SubLayerModel` with ``2 * depth + 2`` sub-layers and ``depth`` units; input ``(B, C, H, W)``,
        output ``(B, num_classes)`` logits.
    """
    cfg = resolve_config(config, VIT_PRESETS, ViTConfig, overrides)
    return build_seeded(lambda: SubLayerModel(vit_layers(cfg), block_unit_ends(cfg.depth)), seed, dtype, meta=meta)
