"""The way back: to_hf(from_hf(hf) after training) computes what our model computes (float64, 1e-10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elastic_pipe.models import ModelError, SubLayerModel, from_hf, to_hf

transformers = pytest.importorskip("transformers")

ATOL = 1e-10


def _rmsnorm_in_input_dtype(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # As in test_models_llama: transformers' LlamaRMSNorm downcasts float64 to float32 (~3e-8 alone); this is the
    # same formula without the downcast, so the comparison measures the exported weights to 1e-10.
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))  # type: ignore[operator]


def _hf(cls: type, config: object) -> torch.nn.Module:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return cls(config).double().eval()  # type: ignore[no-any-return]


def _train(model: SubLayerModel, seed: int = 3) -> None:
    """Perturb every parameter, as training would (a shared parameter is perturbed once)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen, dtype=param.dtype))


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (2, 10), generator=torch.Generator().manual_seed(2))


def _gpt2_config() -> object:
    return transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)


def test_gpt2_round_trip_unties_a_trained_head() -> None:
    config = _gpt2_config()
    model = from_hf(_hf(transformers.GPT2LMHeadModel, config)).eval()
    tokens = _tokens(50)
    with torch.no_grad():
        untrained = to_hf(model, config)
        assert untrained.config.tie_word_embeddings  # the copy still equals the embedding
        torch.testing.assert_close(untrained(input_ids=tokens).logits, model(tokens), rtol=0, atol=ATOL)
        _train(model)
        back = to_hf(model, config)
        assert type(back).__name__ == "GPT2LMHeadModel" and not back.config.tie_word_embeddings
        assert back.lm_head.weight.data_ptr() != back.transformer.wte.weight.data_ptr()
        torch.testing.assert_close(back(input_ids=tokens).logits, model(tokens), rtol=0, atol=ATOL)
        base = from_hf(_hf(transformers.GPT2Model, config)).eval()
        _train(base)
        hidden = to_hf(base, config.to_dict())(input_ids=tokens).last_hidden_state
        torch.testing.assert_close(hidden, base(tokens), rtol=0, atol=ATOL)


def _bert_config(**kw: object) -> object:
    transformers.logging.set_verbosity_error()
    return transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=24,
        **kw,
    )


def test_bert_round_trip_classifier_and_base(tmp_path: Path) -> None:
    config = _bert_config(num_labels=3)
    model = from_hf(_hf(transformers.BertForSequenceClassification, config)).eval()
    _train(model)
    ids = _tokens(100)
    ids[1, 6:] = 0
    mask = (ids != 0).long()
    file = tmp_path / "config.json"
    file.write_text(json.dumps(config.to_dict()), encoding="utf-8")
    with torch.no_grad():
        back = to_hf(model, file)
        assert type(back).__name__ == "BertForSequenceClassification" and back.config.num_labels == 3
        torch.testing.assert_close(back(input_ids=ids, attention_mask=mask).logits, model(ids), rtol=0, atol=ATOL)
        for pooler in (True, False):
            base = from_hf(_hf(transformers.BertModel, _bert_config()), pooler=pooler).eval()
            _train(base)
            out = to_hf(base, _bert_config())(input_ids=ids, attention_mask=mask)
            expected = out.pooler_output if pooler else out.last_hidden_state[:, 0]
            torch.testing.assert_close(expected, base(ids), rtol=0, atol=ATOL)


@pytest.mark.parametrize("tie", [True, False])
def test_llama_round_trip_keeps_a_tied_head_tied(tie: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_in_input_dtype)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
    )
    model = from_hf(_hf(transformers.LlamaForCausalLM, config)).eval()
    _train(model)
    tokens = _tokens(64)
    with torch.no_grad():
        back = to_hf(model, config)
        shared = back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
        assert shared == tie
        torch.testing.assert_close(back(input_ids=tokens).logits, model(tokens), rtol=0, atol=ATOL)


def test_unexportable_models_are_rejected() -> None:
    config = _bert_config(num_labels=3)
    mean = from_hf(_hf(transformers.BertForSequenceClassification, config), pooling="mean")
    with pytest.raises(ModelError, match="mean pooling"):
        to_hf(mean, config)
    vit = transformers.ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=48,
    )
    with pytest.raises(ModelError, match="cannot export"):
        to_hf(from_hf(_hf(transformers.ViTModel, vit)), vit)
