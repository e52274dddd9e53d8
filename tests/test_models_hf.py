"""Hugging Face adapters: the SubLayerModel computes what the transformers model computes (float64, 1e-10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elastic_pipe.models import ModelError, from_hf, from_hf_checkpoint, from_hf_state

transformers = pytest.importorskip("transformers")

ATOL = 1e-10


def _quiet() -> None:
    # Tiny configs keep GPT-2's default bos/eos id 50256 outside the vocabulary; transformers only logs about it.
    transformers.logging.set_verbosity_error()


def _bert_config(**kw: object) -> object:
    _quiet()
    return transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=24,
        **kw,
    )


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (3, 12), generator=gen)
    ids[1, 7:] = 0  # padding
    ids[2, 3:] = 0
    return ids, (ids != 0).long()


def _hf(cls: type, config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(config).double().eval()  # type: ignore[no-any-return]


def test_bert_sequence_classification_matches() -> None:
    hf = _hf(transformers.BertForSequenceClassification, _bert_config(num_labels=3))
    model = from_hf(hf).eval()
    assert model.layer_names[:3] == ("embed", "block0.attn", "block0.mlp")
    assert model.unit_ends == (3, 5)
    ids, mask = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=ATOL)
    assert next(model.parameters()).dtype == torch.float64


def test_bert_base_model_pooler_and_mean_pooling() -> None:
    hf = _hf(transformers.BertModel, _bert_config())
    ids, mask = _ids()
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(from_hf(hf).eval()(ids), out.pooler_output, rtol=0, atol=ATOL)
        first = from_hf(hf, pooler=False).eval()(ids)
        torch.testing.assert_close(first, out.last_hidden_state[:, 0], rtol=0, atol=ATOL)
        mean = from_hf(hf, pooler=False, pooling="mean").eval()(ids)
        keep = mask.unsqueeze(-1).double()
        expected = (out.last_hidden_state * keep).sum(1) / keep.sum(1)
        torch.testing.assert_close(mean, expected, rtol=0, atol=ATOL)


def test_bert_new_classifier_is_seeded_and_weights_are_copies() -> None:
    hf = _hf(transformers.BertModel, _bert_config())
    a, b = from_hf(hf, num_classes=5, seed=7), from_hf(hf, num_classes=5, seed=7)
    assert torch.equal(a[-1].classifier.weight, b[-1].classifier.weight)
    assert a[-1].classifier.weight.shape == (5, 32)
    with torch.no_grad():
        a[0].tokens.weight.zero_()
    assert hf.embeddings.word_embeddings.weight.abs().sum() > 0


def test_vit_image_classification_matches() -> None:
    _quiet()
    config = transformers.ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=10,
    )
    hf = _hf(transformers.ViTForImageClassification, config)
    model = from_hf(hf).eval()
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(pixel_values=x).logits, rtol=0, atol=ATOL)
        base = _hf(transformers.ViTModel, config)
        torch.testing.assert_close(from_hf(base).eval()(x), base(pixel_values=x).pooler_output, rtol=0, atol=ATOL)
    assert model.num_sublayers == 6


def test_gpt2_lm_head_matches_and_state_dict_route() -> None:
    _quiet()
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    hf = _hf(transformers.GPT2LMHeadModel, config)
    model = from_hf(hf).eval()
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        torch.testing.assert_close(model(tokens), expected, rtol=0, atol=ATOL)
        # A saved checkpoint omits the tied lm_head; from_hf_state re-ties it from the embedding.
        state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
        again = from_hf_state(config.to_dict(), state).eval()
        torch.testing.assert_close(again(tokens), expected, rtol=0, atol=ATOL)
        base = _hf(transformers.GPT2Model, config)
        hidden = from_hf(base).eval()(tokens)
        torch.testing.assert_close(hidden, base(input_ids=tokens).last_hidden_state, rtol=0, atol=ATOL)


def test_checkpoint_directory_route(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    hf = _hf(transformers.BertForSequenceClassification, _bert_config(num_labels=2))
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()), encoding="utf-8")
    safetensors_torch.save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, tmp_path / "model.safetensors")
    model = from_hf_checkpoint(tmp_path).eval()
    ids, mask = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=ATOL)
    with pytest.raises(ModelError, match="does not exist"):
        from_hf_checkpoint(tmp_path / "nowhere")


def test_unsupported_inputs_are_rejected() -> None:
    with pytest.raises(ModelError, match=r"\['bert', 'gpt2', 'llama', 'vit'\]"):
        from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ModelError, match="activation"):
        from_hf(_hf(transformers.BertModel, _bert_config(hidden_act="silu")))
    with pytest.raises(ModelError, match="pooler"):
        from_hf_state({"model_type": "bert", **_bert_config(add_pooling_layer=False).to_dict()}, {}, pooler=True)
