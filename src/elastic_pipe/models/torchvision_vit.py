"""Adapter: torchvision's ``VisionTransformer`` (``vit_b_16`` and friends) to :class:`SubLayerModel`.

Written against torchvision's public module layout (``torchvision.models.vision_transformer``): ``conv_proj``
(patch convolution), ``class_token``, ``encoder.pos_embedding``, ``encoder.layers`` (``EncoderBlock`` with ``ln_1``,
``self_attention`` (``nn.MultiheadAttention``), ``ln_2``, ``mlp`` = Linear, GELU, Dropout, Linear, Dropout),
``encoder.ln`` and ``heads`` (``head``, optionally ``pre_logits`` + ``act``). torchvision itself is not imported:
any module with that layout converts. Weights are copied into this package's own sub-layers (each block split into
attention and MLP), so the result computes what ``model(x)`` computes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from elastic_pipe.models._build import build_loaded
from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.layers import ClassifierHead
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends
from elastic_pipe.models.vit import ViTConfig, vit_layers

__all__ = ["from_torchvision_vit"]

_MLP_FIRST, _MLP_ACT, _MLP_SECOND = 0, 1, 3  # positions inside torchvision's MLPBlock


def _attr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not hasattr(obj, part):
            raise ModelError(f"not a torchvision VisionTransformer: it has no attribute {path!r}")
        obj = getattr(obj, part)
    return obj


def _gelu_name(module: nn.Module) -> str:
    if not isinstance(module, nn.GELU):
        raise ModelError(f"expected nn.GELU in the torchvision MLP block, got {type(module).__name__}")
    return "gelu_tanh" if module.approximate == "tanh" else "gelu"


def from_torchvision_vit(model: nn.Module) -> SubLayerModel:
    """Convert a torchvision ``VisionTransformer`` into a :class:`SubLayerModel` with copied weights.

    Args:
        model: e.g. ``torchvision.models.vit_b_16(weights=...)``; a plain convolutional patch embedding is required
            (no ``conv_stem_configs``), and ``representation_size`` must be ``None`` or equal to ``hidden_dim``.

    Returns:
        ``embed``, ``block{i}.attn``, ``block{i}.mlp`` ..., ``head``: input ``(B, 3, H, W)``, output logits, in the
        model's dtype.

    Raises:
        ModelError: if the module does not have torchvision's layout or uses an unsupported option.
    """
    CHECK.instance("model", model, nn.Module)
    conv = _attr(model, "conv_proj")
    if not isinstance(conv, nn.Conv2d):
        raise ModelError(f"only a single Conv2d patch embedding is supported, got conv_proj={type(conv).__name__}")
    blocks = list(_attr(model, "encoder.layers").children())
    if not blocks:
        raise ModelError("the torchvision VisionTransformer has no encoder layers")
    first = blocks[0]
    heads = _attr(model, "heads")
    head_linear = _attr(heads, "head")
    pre_logits = getattr(heads, "pre_logits", None)
    hidden_dim = int(_attr(model, "hidden_dim"))
    if pre_logits is not None and pre_logits.out_features != hidden_dim:
        raise ModelError(f"representation_size={pre_logits.out_features} != hidden_dim={hidden_dim} is not supported")
    attention: nn.MultiheadAttention = _attr(first, "self_attention")
    config = ViTConfig(
        image_size=int(_attr(model, "image_size")),
        patch_size=int(_attr(model, "patch_size")),
        in_channels=conv.in_channels,
        num_classes=head_linear.out_features,
        dim=hidden_dim,
        depth=len(blocks),
        heads=attention.num_heads,
        mlp_dim=int(_attr(model, "mlp_dim")),
        dropout=float(getattr(model, "dropout", 0.0)),
        attention_dropout=float(getattr(model, "attention_dropout", 0.0)),
        eps=first.ln_1.eps,
        act=_gelu_name(first.mlp[_MLP_ACT]),
    )

    def make_layers() -> list[tuple[str, nn.Module]]:
        head = ClassifierHead(
            config.dim, config.num_classes, final_norm=True, eps=config.eps, pooler=pre_logits is not None
        )
        return [*vit_layers(config)[:-1], ("head", head)]

    if conv.bias is None:
        raise ModelError("torchvision's conv_proj has a bias; this one has none")
    t: dict[str, torch.Tensor] = {
        "embed.proj.weight": conv.weight,
        "embed.proj.bias": conv.bias,
        "embed.cls_token": _attr(model, "class_token"),
        "embed.pos_embedding": _attr(model, "encoder.pos_embedding"),
    }
    for i, block in enumerate(blocks):
        a, m = f"block{i}_attn", f"block{i}_mlp"
        attn = block.self_attention
        mlp1, mlp2 = block.mlp[_MLP_FIRST], block.mlp[_MLP_SECOND]
        t.update(
            {
                f"{a}.norm.weight": block.ln_1.weight,
                f"{a}.norm.bias": block.ln_1.bias,
                f"{a}.qkv.weight": attn.in_proj_weight,
                f"{a}.qkv.bias": attn.in_proj_bias,
                f"{a}.proj.weight": attn.out_proj.weight,
                f"{a}.proj.bias": attn.out_proj.bias,
                f"{m}.norm.weight": block.ln_2.weight,
                f"{m}.norm.bias": block.ln_2.bias,
                f"{m}.fc1.weight": mlp1.weight,
                f"{m}.fc1.bias": mlp1.bias,
                f"{m}.fc2.weight": mlp2.weight,
                f"{m}.fc2.bias": mlp2.bias,
            }
        )
    ln = _attr(model, "encoder.ln")
    t.update(
        {
            "head.norm.weight": ln.weight,
            "head.norm.bias": ln.bias,
            "head.classifier.weight": head_linear.weight,
            "head.classifier.bias": head_linear.bias,
        }
    )
    if pre_logits is not None:
        t.update({"head.pooler.weight": pre_logits.weight, "head.pooler.bias": pre_logits.bias})
    weights = {k: v.detach() for k, v in t.items()}
    result, missing = build_loaded(
        lambda: SubLayerModel(make_layers(), block_unit_ends(config.depth)), weights, 0, conv.weight.dtype
    )
    if missing:
        raise ModelError(f"torchvision adapter left sub-layer weights unset: {missing}")
    return result
