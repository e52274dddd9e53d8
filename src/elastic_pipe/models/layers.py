"""The sub-layers every model here is built from: embeddings, attention, MLP and heads.

Each module maps ONE tensor to ONE tensor so that a pipeline may cut between any two of them.

Padding masks travel inside the activation. A BERT-style encoder that sees padded batches needs to know, in every
attention sub-layer, which tokens are padding; a second tensor would break the one-tensor rule, so when
``carries_mask`` is set the activation has one extra trailing feature channel holding 1.0 for real tokens and 0.0
for padding. The embedding writes it, every sub-layer reads it, passes it through untouched and attends only to
real tokens, and the head uses it for mean pooling. Models without padding (ViT, GPT) do not carry it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from elastic_pipe.models._checks import check_eps, check_optional_size, check_positive, check_probability
from elastic_pipe.models.errors import CHECK, ModelError

__all__ = [
    "ACTIVATIONS",
    "AttentionSubLayer",
    "ClassifierHead",
    "LMHead",
    "MLPSubLayer",
    "PatchEmbedding",
    "Pooling",
    "TokenEmbedding",
    "activation",
    "next_token_loss",
    "split_mask",
]

Pooling = Literal["first", "mean"]


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of GELU that GPT-2 was trained with (``gelu_new`` in Hugging Face configs)."""
    return F.gelu(x, approximate="tanh")


# Module-level functions only (no lambdas), so that models pickle and deep-copy.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": gelu_tanh,
    "relu": F.relu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function called ``name``.

    Raises:
        ModelError: if ``name`` is not in :data:`ACTIVATIONS` (the message lists the valid names).
    """
    try:
        return ACTIVATIONS[CHECK.str("act", name)]
    except KeyError:
        raise ModelError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None


def split_mask(x: torch.Tensor, carries_mask: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split an activation into hidden states and the trailing keep-mask channel (``None`` if not carried)."""
    if not carries_mask:
        return x, None
    return x[..., :-1], x[..., -1:]


def _join_mask(h: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return h if keep is None else torch.cat([h, keep], dim=-1)


class PatchEmbedding(nn.Module):
    """Image to tokens: non-overlapping patch convolution, a learned class token in front, learned positions.

    Input ``(B, C, H, W)``; output ``(B, 1 + (H / patch) * (W / patch), dim)``.
    """

    def __init__(self, image_size: int, patch_size: int, in_channels: int, dim: int, dropout: float = 0.0) -> None:
        check_positive("PatchEmbedding", image_size=image_size, patch_size=patch_size, in_channels=in_channels, dim=dim)
        check_probability("PatchEmbedding", dropout=dropout)
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.proj(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        tokens = torch.cat([cls, patches], dim=1) + self.pos_embedding
        return self.dropout(tokens)  # type: ignore[no-any-return]


class TokenEmbedding(nn.Module):
    """Token ids to vectors: token + learned absolute position (+ segment 0) embeddings, optional LayerNorm.

    Input ``(B, T)`` integer ids; output ``(B, T, dim)``, or ``(B, T, dim + 1)`` with the keep-mask channel when
    ``pad_token_id`` is given (ids equal to it are padding).
    """

    def __init__(
        self,
        vocab_size: int,
        max_positions: int,
        dim: int,
        *,
        type_vocab_size: int = 0,
        norm: bool = False,
        eps: float = 1e-12,
        dropout: float = 0.0,
        pad_token_id: int | None = None,
    ) -> None:
        check_positive("TokenEmbedding", vocab_size=vocab_size, max_positions=max_positions, dim=dim)
        check_optional_size("TokenEmbedding", 0, type_vocab_size=type_vocab_size)
        check_optional_size("TokenEmbedding", 0, pad_token_id=pad_token_id)
        check_eps("TokenEmbedding", eps)
        check_probability("TokenEmbedding", dropout=dropout)
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(max_positions, dim)
        # BERT adds a segment embedding; single-segment inputs always use segment 0, so only that row is used.
        self.segments = nn.Embedding(type_vocab_size, dim) if type_vocab_size > 0 else None
        self.norm = nn.LayerNorm(dim, eps=eps) if norm else None
        self.dropout = nn.Dropout(dropout)
        self.pad_token_id = pad_token_id

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] > self.positions.num_embeddings:
            raise ModelError(f"sequence length {ids.shape[1]} exceeds max_positions={self.positions.num_embeddings}")
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.positions(positions)
        if self.segments is not None:
            h = h + self.segments.weight[0]
        if self.norm is not None:
            h = self.norm(h)
        h = self.dropout(h)
        if self.pad_token_id is None:
            return h  # type: ignore[no-any-return]
        keep = (ids != self.pad_token_id).to(h.dtype).unsqueeze(-1)
        return torch.cat([h, keep], dim=-1)


class AttentionSubLayer(nn.Module):
    """Multi-head self-attention with its residual connection.

    ``norm_first=True`` (pre-LN, ViT and GPT): ``x + proj(attn(norm(x)))``. ``norm_first=False`` (post-LN, original
    BERT): ``norm(x + proj(attn(x)))``. ``causal=True`` lets each position attend only to itself and earlier ones.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        norm_first: bool = True,
        causal: bool = False,
        eps: float = 1e-6,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        carries_mask: bool = False,
    ) -> None:
        check_positive("AttentionSubLayer", dim=dim, heads=heads)
        check_eps("AttentionSubLayer", eps)
        check_probability("AttentionSubLayer", dropout=dropout, attention_dropout=attention_dropout)
        super().__init__()
        if dim % heads != 0:
            raise ModelError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.norm_first = norm_first
        self.causal = causal
        self.carries_mask = carries_mask
        self.attention_dropout = attention_dropout
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, keep = split_mask(x, self.carries_mask)
        y = self.norm(h) if self.norm_first else h
        batch, seq, dim = y.shape
        q, k, v = self.qkv(y).view(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        mask = None
        if keep is not None:
            # (B, 1, 1, T): every query may attend to every real key.
            mask = keep.squeeze(-1).bool()[:, None, None, :]
            if self.causal:
                mask = mask & torch.ones(seq, seq, dtype=torch.bool, device=y.device).tril()
        attended = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.attention_dropout if self.training else 0.0,
            is_causal=self.causal and mask is None,
        )
        out = h + self.dropout(self.proj(attended.transpose(1, 2).reshape(batch, seq, dim)))
        if not self.norm_first:
            out = self.norm(out)
        return _join_mask(out, keep)


class MLPSubLayer(nn.Module):
    """Position-wise MLP with its residual connection (pre-LN or post-LN like :class:`AttentionSubLayer`)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        act: str = "gelu",
        norm_first: bool = True,
        eps: float = 1e-6,
        dropout: float = 0.0,
        carries_mask: bool = False,
    ) -> None:
        check_positive("MLPSubLayer", dim=dim, hidden=hidden)
        check_eps("MLPSubLayer", eps)
        check_probability("MLPSubLayer", dropout=dropout)
        super().__init__()
        self.act_name = act
        self.act = activation(act)
        self.norm_first = norm_first
        self.carries_mask = carries_mask
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, keep = split_mask(x, self.carries_mask)
        y = self.norm(h) if self.norm_first else h
        out = h + self.dropout(self.fc2(self.act(self.fc1(y))))
        if not self.norm_first:
            out = self.norm(out)
        return _join_mask(out, keep)

    def extra_repr(self) -> str:
        return f"act={self.act_name!r}"


class ClassifierHead(nn.Module):
    """Sequence to class logits: optional final norm, pooling, optional BERT pooler, optional classifier.

    Pools the first token (ViT's class token, BERT's ``[CLS]``) or the mean of real tokens. With
    ``num_classes=None`` it returns the pooled vector (a sentence embedding; ``normalize`` makes it unit length).
    Output ``(B, num_classes)`` or ``(B, dim)``.
    """

    def __init__(
        self,
        dim: int,
        num_classes: int | None,
        *,
        final_norm: bool = True,
        eps: float = 1e-6,
        pooling: Pooling = "first",
        pooler: bool = False,
        normalize: bool = False,
        dropout: float = 0.0,
        carries_mask: bool = False,
    ) -> None:
        check_positive("ClassifierHead", dim=dim)
        check_optional_size("ClassifierHead", num_classes=num_classes)
        check_eps("ClassifierHead", eps)
        check_probability("ClassifierHead", dropout=dropout)
        super().__init__()
        if CHECK.str("ClassifierHead.pooling", pooling) not in ("first", "mean"):
            raise ModelError(f"pooling must be 'first' or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.normalize = normalize
        self.carries_mask = carries_mask
        self.norm = nn.LayerNorm(dim, eps=eps) if final_norm else None
        self.pooler = nn.Linear(dim, dim) if pooler else None
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(dim, num_classes) if num_classes is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, keep = split_mask(x, self.carries_mask)
        if self.norm is not None:
            h = self.norm(h)
        if self.pooling == "first":
            pooled = h[:, 0]
        elif keep is None:
            pooled = h.mean(dim=1)
        else:
            pooled = (h * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(pooled))
        if self.normalize:
            pooled = F.normalize(pooled, dim=-1)
        if self.classifier is None:
            return pooled
        return self.classifier(self.dropout(pooled))  # type: ignore[no-any-return]


class LMHead(nn.Module):
    """Hidden states to next-token logits: optional final norm, then a bias-free projection onto the vocabulary.

    With ``vocab_size=None`` it returns the normalized hidden states. Output ``(B, T, vocab_size)``.
    """

    def __init__(self, dim: int, vocab_size: int | None, *, final_norm: bool = True, eps: float = 1e-5) -> None:
        check_positive("LMHead", dim=dim)
        check_optional_size("LMHead", vocab_size=vocab_size)
        check_eps("LMHead", eps)
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps) if final_norm else None
        self.proj = nn.Linear(dim, vocab_size, bias=False) if vocab_size is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x) if self.norm is not None else x
        return self.proj(h) if self.proj is not None else h


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``tokens[:, t + 1]`` from ``logits[:, t]`` (the GPT training loss).

    Args:
        logits: ``(B, T, V)`` output of a GPT-style decoder.
        tokens: ``(B, T)`` the same token ids that went into the model (the pipeline's target).

    Raises:
        ModelError: if the shapes do not line up.
    """
    CHECK.instance("logits", logits, torch.Tensor)
    CHECK.instance("tokens", tokens, torch.Tensor)
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ModelError(
            f"need logits (B, T, V) and tokens (B, T), got {tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
