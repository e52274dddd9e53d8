"""torchvision ViT adapter.

torchvision is not installed in the development environment (and must not be installed there), so the adapter is
tested against ``_StandInVisionTransformer`` below: a LOCAL STAND-IN, NOT torchvision code, built to have the same
attribute layout and the same forward computation as ``torchvision.models.vision_transformer.VisionTransformer``
as documented by torchvision. When torchvision is importable, ``test_real_torchvision_vit_matches`` checks the real
class too.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from elastic_pipe.models import ModelError, from_torchvision_vit


class _StandInMLPBlock(nn.Sequential):
    """STAND-IN for torchvision's MLPBlock: Linear, GELU, Dropout, Linear, Dropout."""

    def __init__(self, dim: int, mlp_dim: int) -> None:
        super().__init__(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp_dim, dim), nn.Dropout(0.0))


class _StandInEncoderBlock(nn.Module):
    """STAND-IN for torchvision's EncoderBlock (pre-LN, nn.MultiheadAttention with batch_first=True)."""

    def __init__(self, heads: int, dim: int, mlp_dim: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _StandInMLPBlock(dim, mlp_dim)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(inp)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x) + inp
        return x + self.mlp(self.ln_2(x))


class _StandInEncoder(nn.Module):
    """STAND-IN for torchvision's Encoder: positions, dropout, blocks, final LayerNorm."""

    def __init__(self, seq: int, depth: int, heads: int, dim: int, mlp_dim: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(
            OrderedDict((f"encoder_layer_{i}", _StandInEncoderBlock(heads, dim, mlp_dim)) for i in range(depth))
        )
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))  # type: ignore[no-any-return]


class _StandInVisionTransformer(nn.Module):
    """STAND-IN with torchvision VisionTransformer's attributes and forward (not torchvision code)."""

    def __init__(
        self, image_size: int, patch_size: int, *, depth: int, heads: int, dim: int, mlp_dim: int, classes: int
    ) -> None:
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim, self.mlp_dim = image_size, patch_size, dim, mlp_dim
        self.attention_dropout = self.dropout = 0.0
        self.conv_proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.class_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        seq = (image_size // patch_size) ** 2 + 1
        self.encoder = _StandInEncoder(seq, depth, heads, dim, mlp_dim)
        self.heads = nn.Sequential(OrderedDict(head=nn.Linear(dim, classes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, self.hidden_dim, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])  # type: ignore[no-any-return]


def _images() -> torch.Tensor:
    return torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_stand_in_vision_transformer_matches() -> None:
    torch.manual_seed(0)
    reference = _StandInVisionTransformer(8, 2, depth=3, heads=2, dim=16, mlp_dim=24, classes=5).double().eval()
    model = from_torchvision_vit(reference).eval()
    assert model.num_units == 3
    assert model.layer_names[-2:] == ("block2.mlp", "head")
    with torch.no_grad():
        torch.testing.assert_close(model(_images()), reference(_images()), rtol=0, atol=1e-10)


def test_stand_in_with_pre_logits_matches() -> None:
    torch.manual_seed(1)
    reference = _StandInVisionTransformer(8, 4, depth=1, heads=2, dim=16, mlp_dim=24, classes=4).double().eval()
    # representation_size == hidden_dim: torchvision puts pre_logits (Linear) and act (Tanh) before the head.
    reference.heads = nn.Sequential(
        OrderedDict(pre_logits=nn.Linear(16, 16), act=nn.Tanh(), head=nn.Linear(16, 4))
    ).double()
    model = from_torchvision_vit(reference).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(_images()), reference(_images()), rtol=0, atol=1e-10)


def test_wrong_layout_is_rejected() -> None:
    with pytest.raises(ModelError, match="conv_proj"):
        from_torchvision_vit(nn.Linear(2, 2))


def test_real_torchvision_vit_matches() -> None:
    vision_transformer = pytest.importorskip("torchvision.models.vision_transformer")
    torch.manual_seed(0)
    reference = vision_transformer.VisionTransformer(
        image_size=8, patch_size=2, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=24, num_classes=5
    )
    reference = reference.double().eval()
    model = from_torchvision_vit(reference).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(_images()), reference(_images()), rtol=0, atol=1e-10)
