"""Llama-style decoder: the SubLayerModel computes what transformers' LlamaForCausalLM computes, and learns alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elastic_pipe.models import (
    LlamaConfig,
    ModelError,
    from_hf,
    from_hf_checkpoint,
    from_hf_state,
    llama_config,
    llama_config_from_hf,
    llama_decoder,
    llama_weight_map,
    meta_build,
    next_token_loss,
)
from elastic_pipe.models.llama import RMSNorm, llama_model

transformers = pytest.importorskip("transformers")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")

ATOL = 1e-10
VOCAB = 64


def _rmsnorm_in_input_dtype(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # transformers' LlamaRMSNorm computes in float32 whatever the input dtype (for float64 that is a downcast, which
    # alone costs ~3e-8). Our RMSNorm computes in float64 for float64; this stand-in is the same formula without
    # the downcast, so the float64 comparisons below measure everything else to 1e-10.
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))  # type: ignore[operator]


@pytest.fixture
def float64_rmsnorm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_in_input_dtype)


def _config(**kw: object) -> object:
    transformers.logging.set_verbosity_error()
    fields: dict[str, object] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "max_position_embeddings": 32,
        **kw,
    }
    return transformers.LlamaConfig(**fields)


def _hf(config: object, cls_name: str = "LlamaForCausalLM", dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).to(dtype).eval()
    with torch.no_grad():  # RMSNorm weights start at 1; make them non-trivial so the comparison covers them
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model  # type: ignore[no-any-return]


def _tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.usefixtures("float64_rmsnorm")
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_hugging_face(tied: bool, kv_heads: int) -> None:
    hf = _hf(_config(tie_word_embeddings=tied, num_key_value_heads=kv_heads, attention_bias=kv_heads == 1))
    model = from_hf(hf).eval()
    assert model.layer_names == ("embed", "block0.attn", "block0.mlp", "block1.attn", "block1.mlp", "head")
    assert model.unit_ends == (3, 5)
    assert (model[-1].proj.weight is model[0].tokens.weight) is tied
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, rtol=0, atol=ATOL)
    assert next(model.parameters()).dtype == torch.float64


@pytest.mark.usefixtures("float64_rmsnorm")
@pytest.mark.parametrize("tied", [False, True])
def test_gradients_and_one_sgd_step_match(tied: bool) -> None:
    hf = _hf(_config(tie_word_embeddings=tied))
    model = from_hf(hf)
    hf.train()
    tokens = _tokens()
    next_token_loss(model(tokens), tokens).backward()
    next_token_loss(hf(input_ids=tokens).logits, tokens).backward()
    hf_params = dict(hf.named_parameters(remove_duplicate=False))
    ours = dict(model.named_parameters(remove_duplicate=False))
    pairs = [(ours[k], hf_params[v]) for k, v in llama_weight_map(llama_config_from_hf(hf.config)).items()]
    assert len(pairs) == len(ours) == 1 + 9 * 2 + 2  # embed, (4 + 1 attn, 3 + 1 mlp) per block, head
    for mine, theirs in pairs:
        assert mine.grad is not None and theirs.grad is not None
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=ATOL)
    for params in (model.parameters(), hf.parameters()):
        torch.optim.SGD(params, lr=0.5).step()
    for mine, theirs in pairs:
        torch.testing.assert_close(mine, theirs, rtol=0, atol=ATOL)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(tokens), hf.eval()(input_ids=tokens).logits, rtol=0, atol=ATOL)


def test_float32_matches_unpatched_hugging_face() -> None:
    hf = _hf(_config(), dtype=torch.float32)
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(from_hf(hf).eval()(tokens), hf(input_ids=tokens).logits, rtol=0, atol=1e-6)


@pytest.mark.usefixtures("float64_rmsnorm")
def test_base_model_gives_final_hidden_states() -> None:
    hf = _hf(_config(), "LlamaModel")
    model = from_hf(hf).eval()
    assert model[-1].proj is None
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).last_hidden_state, rtol=0, atol=ATOL)


@pytest.mark.usefixtures("float64_rmsnorm")
@pytest.mark.parametrize("tied", [False, True])
def test_saved_checkpoint_routes(tied: bool, tmp_path: Path) -> None:
    hf = _hf(_config(tie_word_embeddings=tied))
    hf.save_pretrained(tmp_path)
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert ("lm_head.weight" in set(f.keys())) is not tied  # a tied checkpoint stores the matrix once
    tokens = _tokens()
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        model = from_hf_checkpoint(tmp_path).eval()
        torch.testing.assert_close(model(tokens), expected, rtol=0, atol=ATOL)
        assert (model[-1].proj.weight is model[0].tokens.weight) is tied
        config = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
        again = from_hf_state(config, dict(hf.state_dict())).eval()
        torch.testing.assert_close(again(tokens), expected, rtol=0, atol=ATOL)


def test_config_from_hf_reads_both_rope_layouts() -> None:
    new = llama_config_from_hf(_config(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}))
    old = llama_config_from_hf({**_config().to_dict(), "rope_parameters": None, "rope_theta": 500000.0})
    assert new == old
    assert new.rope_theta == 500000.0 and new.kv_heads == 2 and new.head_size == 8


def test_unsupported_hugging_face_configs_are_rejected() -> None:
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ModelError, match=r"rope_type 'default'.*'linear'"):
        llama_config_from_hf(_config(rope_parameters=scaled))
    with pytest.raises(ModelError, match="hidden_act='gelu'"):
        llama_config_from_hf(_config(hidden_act="gelu"))
    with pytest.raises(ModelError, match="do not apply"):
        from_hf(_hf(_config()), num_classes=3)


def test_decoder_is_seeded_and_causal() -> None:
    a, b = llama_decoder("llama-tiny", seed=3), llama_decoder("llama-tiny", seed=3)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    norms = [m.weight for m in a.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 2 + 1 and all(bool((w == 1).all()) for w in norms)
    tokens = _tokens()
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(a(tokens)[:, :8], a(changed)[:, :8], rtol=0, atol=0)
    tied = llama_decoder("llama-tiny", tie_embeddings=True, dtype=torch.float64)
    assert tied[-1].proj.weight is tied[0].tokens.weight and tied[0].tokens.weight.dtype == torch.float64
    with pytest.raises(ModelError, match="max_positions=64"):
        a(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize(("preset", "params"), [("llama-2-7b", 6_738_415_616), ("llama-3-8b", 8_030_261_248)])
def test_published_parameter_counts(preset: str, params: int) -> None:
    model = meta_build(lambda: llama_model(llama_config(preset)))
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.num_sublayers == 2 * 32 + 2


def test_config_validation() -> None:
    with pytest.raises(ModelError, match="kv_heads=3 must divide heads=4"):
        llama_config("llama-tiny", kv_heads=3)
    with pytest.raises(ModelError, match="even head size"):
        llama_config("llama-tiny", head_dim=7)
    with pytest.raises(ModelError, match="needs lm_head=True"):
        LlamaConfig(vocab_size=8, max_positions=8, dim=8, depth=1, heads=2, kv_heads=1, mlp_dim=8,
                    tie_embeddings=True, lm_head=False)  # fmt: skip
    with pytest.raises(ModelError, match="unknown LlamaConfig preset"):
        llama_config("llama-huge")
