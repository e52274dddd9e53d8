"""Analytic per-sub-layer costs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from elastic_pipe.models import ModelError, analyze, attention_flops, gpt_decoder, sublayer_costs, vit


def test_vit_tiny_profile_exact() -> None:
    model = vit("vit-tiny", dtype=torch.float64)
    profiles = analyze(model, torch.zeros(2, 1, 8, 8, dtype=torch.float64))
    assert [p.name for p in profiles] == list(model.layer_names)
    embed, attn, mlp, head = profiles[0], profiles[1], profiles[2], profiles[-1]
    tokens, dim, hidden = 17, 64, 128
    # parameters: conv 64*1*2*2 + 64, class token 64, positions 17*64
    assert embed.params == 64 * 4 + 64 + 64 + tokens * dim
    assert attn.params == 2 * dim + dim * 3 * dim + 3 * dim + dim * dim + dim
    assert mlp.params == 2 * dim + dim * hidden + hidden + hidden * dim + dim
    assert head.params == 2 * dim + dim * 10 + 10
    assert sum(p.params for p in profiles) == sum(p.numel() for p in model.parameters())
    assert embed.param_bytes == 8 * embed.params
    # outputs per sample: 17 x 64 between blocks, 10 logits at the end
    assert [p.output_elements for p in profiles[:-1]] == [tokens * dim] * 13
    assert head.output_elements == 10
    # forward FLOPs per sample: 16 patches x 64 outputs x 4 MACs; two matmuls in the MLP; formula for attention
    assert embed.forward_flops == 2 * 16 * 64 * 4
    assert mlp.forward_flops == 2 * 2 * tokens * dim * hidden
    assert attn.forward_flops == attention_flops(tokens, dim) == 2 * tokens * dim * 4 * dim + 4 * tokens**2 * dim
    assert head.forward_flops == 2 * dim * 10


def test_sublayer_costs_scale_with_micro_batch() -> None:
    model = gpt_decoder("gpt-tiny")
    example = torch.zeros(1, 16, dtype=torch.long)
    one = sublayer_costs(model, example, micro_batch=1)
    eight = sublayer_costs(model, example, micro_batch=8, activation_bytes_per_element=2, flops_per_second=1e9)
    assert [c.name for c in one] == list(model.layer_names)
    profile = analyze(model, example)
    for c1, c8, p in zip(one, eight, profile, strict=True):
        assert c1.activation_bytes == 4 * p.output_elements
        assert c8.activation_bytes == 2 * 8 * p.output_elements
        assert c1.memory_bytes == 4 * p.param_bytes + c1.activation_bytes  # Adam: weights, grads, two moments
        assert c1.forward == 0.0
        assert c8.forward == pytest.approx(8 * p.forward_flops / 1e9)
        assert c8.backward == pytest.approx(2 * c8.forward)
    # The LM head's output is the vocabulary logits: 16 tokens x 64.
    assert profile[-1].output_elements == 16 * 64


def test_meta_model_published_size() -> None:
    with torch.device("meta"):
        model = vit("vit-b16")
        profiles = analyze(model, torch.empty(1, 3, 224, 224))
    assert profiles[1].output_elements == 197 * 768
    assert sum(p.params for p in profiles) == 86_567_656


def test_bad_inputs() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ModelError, match="micro_batch"):
        sublayer_costs(model, torch.zeros(1, 2), micro_batch=0)
    with pytest.raises(ModelError, match="flops_per_second"):
        sublayer_costs(model, torch.zeros(1, 2), flops_per_second=0.0)
    with pytest.raises(ModelError, match="at least one sample"):
        analyze(model, torch.zeros(0, 2))
    with pytest.raises(ModelError, match="SubLayerModel"):
        analyze(nn.Linear(2, 2), torch.zeros(1, 2))
    assert [p.name for p in analyze([("only", nn.Linear(2, 3))], torch.zeros(1, 2))] == ["only"]
