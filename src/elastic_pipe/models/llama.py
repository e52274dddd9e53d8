"""Llama-style decoder (Touvron et al., 2023: LLaMA / Llama 2) at sub-layer granularity.

Sub-layers: ``embed`` (token embedding only; positions are rotary), then ``block{i}.attn`` and ``block{i}.mlp``
for each pre-norm block, then ``head`` (final RMSNorm and the projection onto the vocabulary). A block's attention
is causal grouped-query attention (Ainslie et al., 2023: ``kv_heads`` key/value heads, each shared by
``heads / kv_heads`` query heads) with rotary position embeddings (Su et al., 2021, RoFormer) on queries and keys;
its MLP is SwiGLU (Shazeer, 2020): ``down(silu(gate(x)) * up(x))``. Every norm is RMSNorm (Zhang & Sennrich, 2019).

Numerics follow Hugging Face's ``LlamaForCausalLM`` so that pretrained checkpoints compute what they were trained
to compute: rotary angles are computed in float32 and cast to the activation dtype, and RMSNorm computes in at
least float32 (in float64 for a float64 model, where Hugging Face drops to float32).

With ``tie_embeddings`` the head's projection IS the token embedding (one ``nn.Parameter`` in two sub-layers), as
in the checkpoint. A pipeline that puts ``embed`` and ``head`` on different stages holds the matrix on both and
must sum the two stages' gradients before each step (see
:func:`elastic_pipe.models.residency.shared_parameters`).

:func:`llama_weight_map` names, for every tensor of the model, the Hugging Face checkpoint key it is loaded from;
it is what :func:`elastic_pipe.models.residency.load_sublayers` needs to load only the sub-layers a rank runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from elastic_pipe.models._build import build_seeded, resolve_config
from elastic_pipe.models._checks import check_eps, check_positive, check_probability
from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.residency import MappingReader, load_sublayers, materialize, meta_build
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends
from elastic_pipe.models.weights import SeededInit

__all__ = [
    "LLAMA_HF_DEFAULTS",
    "LLAMA_PRESETS",
    "LlamaAttentionSubLayer",
    "LlamaConfig",
    "LlamaHead",
    "RMSNorm",
    "SwiGLUSubLayer",
    "TokenLookup",
    "llama_config",
    "llama_config_from_hf",
    "llama_decoder",
    "llama_from_state",
    "llama_layers",
    "llama_model",
    "llama_weight_map",
    "rotary_cos_sin",
]


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """Shape of a Llama-style decoder.

    Attributes:
        vocab_size: token vocabulary.
        max_positions: context length the checkpoint was trained for (longer inputs are rejected).
        dim: hidden width.
        depth: number of blocks (the freezable units).
        heads: query heads.
        kv_heads: key/value heads; must divide ``heads`` (``heads`` for plain multi-head attention).
        mlp_dim: SwiGLU hidden width.
        head_dim: width of one head; ``None`` means ``dim // heads`` (then ``heads`` must divide ``dim``).
        rope_theta: rotary base (10000 in Llama 2, 500000 in Llama 3).
        eps: RMSNorm epsilon.
        tie_embeddings: the head's projection is the token embedding (one parameter).
        lm_head: project onto the vocabulary; ``False`` returns the final normalized hidden states (``LlamaModel``).
        attention_bias: biases on the q/k/v/o projections.
        mlp_bias: biases on the gate/up/down projections.
        attention_dropout: dropout on attention probabilities (training only).
    """

    vocab_size: int
    max_positions: int
    dim: int
    depth: int
    heads: int
    kv_heads: int
    mlp_dim: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    eps: float = 1e-6
    tie_embeddings: bool = False
    lm_head: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0

    def __post_init__(self) -> None:
        check_positive(
            "LlamaConfig",
            vocab_size=self.vocab_size,
            max_positions=self.max_positions,
            dim=self.dim,
            depth=self.depth,
            heads=self.heads,
            kv_heads=self.kv_heads,
            mlp_dim=self.mlp_dim,
        )
        if self.heads % self.kv_heads:
            raise ModelError(f"LlamaConfig.kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.head_dim is None and self.dim % self.heads:
            raise ModelError(f"LlamaConfig.heads={self.heads} must divide dim={self.dim} when head_dim is None")
        if self.head_dim is not None:
            check_positive("LlamaConfig", head_dim=self.head_dim)
        if self.head_size % 2:
            raise ModelError(f"LlamaConfig: rotary embeddings need an even head size, got {self.head_size}")
        if not (math.isfinite(CHECK.number("LlamaConfig.rope_theta", self.rope_theta)) and self.rope_theta > 1.0):
            raise ModelError(f"LlamaConfig.rope_theta must be > 1, got {self.rope_theta!r}")
        check_eps("LlamaConfig", self.eps)
        if self.tie_embeddings and not self.lm_head:
            raise ModelError("LlamaConfig.tie_embeddings needs lm_head=True (there is no projection to tie)")
        check_probability("LlamaConfig", attention_dropout=self.attention_dropout)

    @property
    def head_size(self) -> int:
        """Width of one attention head (``head_dim``, or ``dim // heads`` when it is ``None``)."""
        return self.head_dim if self.head_dim is not None else self.dim // self.heads


LLAMA_PRESETS: dict[str, LlamaConfig] = {
    # Small and fast, for tests and CPU examples: 4 query heads share 2 key/value heads.
    "llama-tiny": LlamaConfig(vocab_size=64, max_positions=64, dim=32, depth=2, heads=4, kv_heads=2, mlp_dim=64),
    # Published shapes (the released checkpoints' config.json files).
    "llama-2-7b": LlamaConfig(
        vocab_size=32000, max_positions=4096, dim=4096, depth=32, heads=32, kv_heads=32, mlp_dim=11008, eps=1e-5
    ),
    "llama-3-8b": LlamaConfig(
        vocab_size=128256,
        max_positions=8192,
        dim=4096,
        depth=32,
        heads=32,
        kv_heads=8,
        mlp_dim=14336,
        rope_theta=500000.0,
        eps=1e-5,
    ),
}


def llama_config(name: str, **overrides: Any) -> LlamaConfig:
    """The preset ``name`` (see :data:`LLAMA_PRESETS`) with ``overrides`` applied.

    Raises:
        ModelError: for an unknown preset or field, or an invalid resulting config.
    """
    return resolve_config(name, LLAMA_PRESETS, LlamaConfig, overrides)


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, computed in at least float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rotary_cos_sin(
    seq_len: int, head_size: int, theta: float, *, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(seq_len, head_size)``, of the rotary angles of positions ``0 .. seq_len - 1``.

    Position ``t`` turns feature pair ``(j, j + head_size / 2)`` by ``t * theta ** (-2j / head_size)``. The angles
    are computed in float32 (as the checkpoints were trained) and the result cast to ``dtype``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float32, device=device) / head_size))
    angles = torch.arange(seq_len, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    both = torch.cat([angles, angles], dim=-1)
    return both.cos().to(dtype), both.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class TokenLookup(nn.Module):
    """Token ids ``(B, T)`` to vectors ``(B, T, dim)``; Llama adds no position embedding here (it is rotary)."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids)  # type: ignore[no-any-return]


class LlamaAttentionSubLayer(nn.Module):
    """``x + o_proj(attn(rope(q), rope(k), v))`` of ``RMSNorm(x)``: causal grouped-query attention and its residual.

    Input and output ``(B, T, dim)``; the positions are ``0 .. T - 1``.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        c, hd = config, config.head_size
        self.heads, self.kv_heads, self.head_size = c.heads, c.kv_heads, hd
        self.rope_theta, self.max_positions, self.attention_dropout = c.rope_theta, c.max_positions, c.attention_dropout
        self.norm = RMSNorm(c.dim, c.eps)
        self.q_proj = nn.Linear(c.dim, c.heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.dim, c.kv_heads * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.dim, c.kv_heads * hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.heads * hd, c.dim, bias=c.attention_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        if seq > self.max_positions:
            raise ModelError(f"sequence length {seq} exceeds max_positions={self.max_positions}")
        y = self.norm(x)
        q = self.q_proj(y).view(batch, seq, self.heads, self.head_size).transpose(1, 2)
        k = self.k_proj(y).view(batch, seq, self.kv_heads, self.head_size).transpose(1, 2)
        v = self.v_proj(y).view(batch, seq, self.kv_heads, self.head_size).transpose(1, 2)
        cos, sin = rotary_cos_sin(seq, self.head_size, self.rope_theta, device=x.device, dtype=q.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # Key/value head g serves query heads [g * group, (g + 1) * group).
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attention_dropout if self.training else 0.0, is_causal=True
        )
        out = self.o_proj(attended.transpose(1, 2).reshape(batch, seq, self.heads * self.head_size))
        return x + out  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kv_heads={self.kv_heads}, rope_theta={self.rope_theta}"


class SwiGLUSubLayer(nn.Module):
    """``x + down_proj(silu(gate_proj(y)) * up_proj(y))`` with ``y = RMSNorm(x)``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        c = config
        self.norm = RMSNorm(c.dim, c.eps)
        self.gate_proj = nn.Linear(c.dim, c.mlp_dim, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.dim, c.mlp_dim, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.mlp_dim, c.dim, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))  # type: ignore[no-any-return]


class LlamaHead(nn.Module):
    """Final RMSNorm, then (``vocab_size`` given) a bias-free projection onto the vocabulary."""

    def __init__(self, dim: int, vocab_size: int | None, eps: float) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, eps)
        self.proj = nn.Linear(dim, vocab_size, bias=False) if vocab_size is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.norm(x)
        return self.proj(h) if self.proj is not None else h


def llama_layers(config: LlamaConfig) -> list[tuple[str, nn.Module]]:
    """Freshly constructed decoder sub-layers in order, the head's projection tied when the config says so."""
    c = config
    embed = TokenLookup(c.vocab_size, c.dim)
    layers: list[tuple[str, nn.Module]] = [("embed", embed)]
    for i in range(c.depth):
        layers += [(f"block{i}.attn", LlamaAttentionSubLayer(c)), (f"block{i}.mlp", SwiGLUSubLayer(c))]
    head = LlamaHead(c.dim, c.vocab_size if c.lm_head else None, c.eps)
    if c.tie_embeddings:
        assert head.proj is not None  # __post_init__ rejects tie_embeddings without lm_head
        head.proj.weight = embed.tokens.weight
    layers.append(("head", head))
    return layers


def llama_model(config: LlamaConfig) -> SubLayerModel:
    """The decoder as a :class:`SubLayerModel` with default-initialized weights (build it on the meta device)."""
    CHECK.instance("config", config, LlamaConfig)
    return SubLayerModel(llama_layers(config), block_unit_ends(config.depth))


def llama_decoder(
    config: LlamaConfig | str = "llama-tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    meta: bool = False,
    **overrides: Any,
) -> SubLayerModel:
    """Build a seeded Llama-style decoder (RMSNorm weights 1, everything else the package's truncated normal).

    Args:
        config: a :class:`LlamaConfig` or a preset name from :data:`LLAMA_PRESETS`.
        seed: initialization seed (the global RNG is not touched).
        dtype: parameter dtype (float64 works on CPU).
        meta: build on the meta device (shapes, no storage) with the seeded recipe as ``sublayer_init``, so each
            rank materializes only what it holds (:func:`~elastic_pipe.models.weights.materialize_sublayers`); the
            values are the same as the whole model's.
        **overrides: config fields to replace, e.g. ``depth=4``.

    Returns:
        A :class:`SubLayerModel`; input ``(B, T)`` token ids, output ``(B, T, vocab_size)`` logits.
    """
    cfg = resolve_config(config, LLAMA_PRESETS, LlamaConfig, overrides)
    return build_seeded(
        lambda: llama_model(cfg), seed, dtype, meta=meta, init=lambda s: SeededInit(s, norms=(RMSNorm, nn.LayerNorm))
    )


#: Hugging Face ``LlamaConfig`` defaults for fields a ``config.json`` may leave out (transformers 4.x and 5.x).
LLAMA_HF_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "num_key_value_heads": None,
    "head_dim": None,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rope_parameters": None,
    "pretraining_tp": 1,
}


def _field(cfg: Any, name: str) -> Any:
    value = cfg.get(name, LLAMA_HF_DEFAULTS.get(name)) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
    return LLAMA_HF_DEFAULTS.get(name) if value is None else value


def llama_config_from_hf(cfg: Any, *, lm_head: bool = True) -> LlamaConfig:
    """Our :class:`LlamaConfig` from a Hugging Face ``LlamaConfig`` or its ``config.json`` dict.

    Args:
        cfg: a transformers ``LlamaConfig`` or a mapping with its fields (missing ones take
            :data:`LLAMA_HF_DEFAULTS`).
        lm_head: ``False`` for a base ``LlamaModel`` (no projection onto the vocabulary, no tie).

    Raises:
        ModelError: for what this decoder does not compute: another activation than SiLU, a rotary scaling
            (``rope_type`` other than ``"default"``), ``pretraining_tp > 1``.
    """
    if _field(cfg, "hidden_act") != "silu":
        raise ModelError(f"only SiLU (SwiGLU) Llama MLPs are supported, got hidden_act={_field(cfg, 'hidden_act')!r}")
    if _field(cfg, "pretraining_tp") != 1:
        raise ModelError(f"pretraining_tp must be 1, got {_field(cfg, 'pretraining_tp')!r}")
    # transformers 5.x keeps theta in rope_parameters; 4.x config.json files have rope_theta and rope_scaling.
    rope = _field(cfg, "rope_parameters") or _field(cfg, "rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ModelError(f"only unscaled rotary embeddings are supported (rope_type 'default'), got {rope_type!r}")
    heads = int(_field(cfg, "num_attention_heads"))
    tie = bool(_field(cfg, "tie_word_embeddings")) and lm_head
    return LlamaConfig(
        vocab_size=int(_field(cfg, "vocab_size")),
        max_positions=int(_field(cfg, "max_position_embeddings")),
        dim=int(_field(cfg, "hidden_size")),
        depth=int(_field(cfg, "num_hidden_layers")),
        heads=heads,
        kv_heads=int(_field(cfg, "num_key_value_heads") or heads),
        mlp_dim=int(_field(cfg, "intermediate_size")),
        head_dim=_field(cfg, "head_dim"),
        rope_theta=float(rope.get("rope_theta", _field(cfg, "rope_theta"))),
        eps=float(_field(cfg, "rms_norm_eps")),
        tie_embeddings=tie,
        lm_head=lm_head,
        attention_bias=bool(_field(cfg, "attention_bias")),
        mlp_bias=bool(_field(cfg, "mlp_bias")),
        attention_dropout=float(_field(cfg, "attention_dropout")),
    )


def llama_weight_map(config: LlamaConfig, prefix: str = "model.") -> dict[str, str]:
    """For every state-dict key of the decoder, the Hugging Face checkpoint key it is loaded from.

    Args:
        config: the decoder's config.
        prefix: the base model's prefix in the checkpoint (``"model."`` for ``LlamaForCausalLM``, ``""`` for a
            saved ``LlamaModel``).

    Returns:
        ``{"embed.tokens.weight": "model.embed_tokens.weight", "block0_attn.q_proj.weight":
        "model.layers.0.self_attn.q_proj.weight", ..., "head.proj.weight": "lm_head.weight"}``; a tied head reads
        the embedding's key (tied checkpoints store only that one).
    """
    CHECK.instance("config", config, LlamaConfig)
    CHECK.str("prefix", prefix)
    c, p = config, prefix
    names: dict[str, str] = {"embed.tokens.weight": f"{p}embed_tokens.weight"}
    biases = {"attn": c.attention_bias, "mlp": c.mlp_bias}
    parts = {
        "attn": ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"), "input_layernorm"),
        "mlp": ("mlp", ("gate_proj", "up_proj", "down_proj"), "post_attention_layernorm"),
    }
    for i in range(c.depth):
        for kind, (module, projections, norm) in parts.items():
            ours, theirs = f"block{i}_{kind}", f"{p}layers.{i}"
            for proj in projections:
                for tensor in ("weight", "bias") if biases[kind] else ("weight",):
                    names[f"{ours}.{proj}.{tensor}"] = f"{theirs}.{module}.{proj}.{tensor}"
            names[f"{ours}.norm.weight"] = f"{theirs}.{norm}.weight"
    names["head.norm.weight"] = f"{p}norm.weight"
    if c.lm_head:
        names["head.proj.weight"] = f"{p}embed_tokens.weight" if c.tie_embeddings else "lm_head.weight"
    return names


def llama_from_state(
    config: LlamaConfig, state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype, prefix: str = "model."
) -> SubLayerModel:
    """The decoder on the CPU holding a Hugging Face ``LlamaForCausalLM`` state dict's weights (copies).

    Built on the meta device and filled through :func:`llama_weight_map`, so no time goes into initializing
    weights that get overwritten; a tied checkpoint needs no ``lm_head.weight``.

    Raises:
        ModelError: if a tensor is missing or has the wrong shape.
    """
    model = meta_build(lambda: llama_model(config))
    everything = range(model.num_sublayers)
    materialize(model, everything, "cpu", dtype=dtype)
    load_sublayers(model, everything, MappingReader(state_dict), llama_weight_map(config, prefix))
    return model
