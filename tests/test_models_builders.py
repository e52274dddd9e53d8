"""The package's own BERT-style encoder and GPT-style decoder."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_pipe.models import (
    BertConfig,
    ModelError,
    bert_config,
    bert_encoder,
    gpt_config,
    gpt_decoder,
    next_token_loss,
)

_BERT = bert_encoder("bert-tiny", dtype=torch.float64).eval()
_GPT = gpt_decoder("gpt-tiny", dtype=torch.float64).eval()
_BERT_MEAN = bert_encoder("bert-tiny", dtype=torch.float64, pooling="mean", pooler=False).eval()


def test_bert_structure_and_mask_channel() -> None:
    assert _BERT.layer_names == ("embed", "block0.attn", "block0.mlp", "block1.attn", "block1.mlp", "head")
    assert _BERT.unit_ends == (3, 5)
    ids = torch.tensor([[5, 6, 7, 0, 0]])
    hidden = _BERT.slice(0, 3)(ids)
    # 32 features plus the keep-mask channel: 1 for real tokens, 0 for padding.
    assert hidden.shape == (1, 5, 33)
    assert hidden[0, :, -1].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert _BERT(ids).shape == (1, 2)


@settings(max_examples=6, deadline=None)
@given(length=st.integers(min_value=1, max_value=8), pad=st.integers(min_value=1, max_value=6))
def test_bert_padding_does_not_change_real_outputs(length: int, pad: int) -> None:
    gen = torch.Generator().manual_seed(length * 10 + pad)
    ids = torch.randint(1, 128, (1, length), generator=gen)
    padded = torch.cat([ids, torch.zeros(1, pad, dtype=torch.long)], dim=1)
    torch.testing.assert_close(_BERT(padded), _BERT(ids), rtol=0, atol=1e-12)
    torch.testing.assert_close(_BERT_MEAN(padded), _BERT_MEAN(ids), rtol=0, atol=1e-12)


def test_bert_pre_ln_and_no_padding_variant() -> None:
    model = bert_encoder("bert-tiny", norm_first=True, pad_token_id=None, num_classes=None, pooler=False)
    ids = torch.randint(0, 128, (2, 6))
    assert model.slice(0, 2)(ids).shape == (2, 6, 32)
    assert model(ids).shape == (2, 32)
    assert model[-1].norm is not None  # pre-LN needs a final norm in the head


def test_bert_published_parameter_counts_on_meta() -> None:
    with torch.device("meta"):
        base = bert_encoder("bert-base")
        large = bert_encoder("bert-large")
    # Hugging Face BertForSequenceClassification with 2 labels: 109,483,778 and 335,143,938 parameters.
    assert sum(p.numel() for p in base.parameters()) == 109_483_778
    assert sum(p.numel() for p in large.parameters()) == 335_143_938
    assert (base.num_units, large.num_units) == (12, 24)


def test_bert_config_validation() -> None:
    with pytest.raises(ModelError, match="bert-base"):
        bert_config("bert-huge")
    with pytest.raises(ModelError, match="pad_token_id"):
        bert_config("bert-tiny", pad_token_id=128)
    with pytest.raises(ModelError, match="pooling"):
        bert_config("bert-tiny", pooling="max")
    with pytest.raises(ModelError, match="num_classes"):
        BertConfig(vocab_size=8, max_positions=8, type_vocab_size=0, num_classes=0, dim=4, depth=1, heads=1, mlp_dim=4)


def test_gpt_structure_and_tied_init() -> None:
    assert _GPT.unit_ends == (3, 5)
    tokens = torch.randint(0, 64, (2, 12))
    assert _GPT(tokens).shape == (2, 12, 64)
    assert torch.equal(_GPT[-1].proj.weight, _GPT[0].tokens.weight)
    assert _GPT[-1].proj.weight is not _GPT[0].tokens.weight  # separate parameters: stages may differ


@settings(max_examples=6, deadline=None)
@given(cut=st.integers(min_value=1, max_value=11))
def test_gpt_is_causal(cut: int) -> None:
    gen = torch.Generator().manual_seed(cut)
    tokens = torch.randint(0, 64, (1, 12), generator=gen)
    changed = tokens.clone()
    changed[0, cut:] = (changed[0, cut:] + 1) % 64
    torch.testing.assert_close(_GPT(tokens)[:, :cut], _GPT(changed)[:, :cut], rtol=0, atol=0)
    assert not torch.allclose(_GPT(tokens)[:, cut:], _GPT(changed)[:, cut:])


def test_next_token_loss_exact() -> None:
    # Uniform logits over V tokens give loss log(V) whatever the targets.
    logits = torch.zeros(2, 5, 7, dtype=torch.float64)
    tokens = torch.randint(0, 7, (2, 5))
    assert next_token_loss(logits, tokens).item() == pytest.approx(math.log(7), abs=1e-12)
    # Perfect prediction of the next token drives the loss to ~0.
    sure = torch.full((1, 3, 4), -1e9, dtype=torch.float64)
    seq = torch.tensor([[1, 3, 2]])
    sure[0, 0, 3] = 0.0
    sure[0, 1, 2] = 0.0
    assert next_token_loss(sure, seq).item() == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ModelError, match="logits"):
        next_token_loss(logits, tokens[:, :4])


def test_gpt_published_parameter_counts_on_meta() -> None:
    expected = {  # published tied counts plus one untied vocab x dim output matrix
        "gpt2": 124_439_808 + 50257 * 768,
        "gpt2-medium": 354_823_168 + 50257 * 1024,
        "gpt2-large": 774_030_080 + 50257 * 1280,
        "gpt2-xl": 1_557_611_200 + 50257 * 1600,
    }
    for name, count in expected.items():
        with torch.device("meta"):
            model = gpt_decoder(name)
        assert sum(p.numel() for p in model.parameters()) == count, name
    assert gpt_config("gpt2-xl").depth == 48
    with pytest.raises(ModelError, match="gpt-tiny"):
        gpt_config("gpt3")


def test_gpt_trains_float64() -> None:
    model = gpt_decoder("gpt-tiny", dtype=torch.float64, seed=1)
    # A repeating sequence is learnable: loss must fall well below log(64) = 4.16.
    tokens = torch.arange(16).repeat(4, 2)[:, :24] % 8
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = last = 0.0
    for step in range(12):
        loss = next_token_loss(model(tokens), tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if step == 0 else first
        last = loss.item()
    assert last < 0.5 * first
