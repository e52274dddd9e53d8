"""Stage residency: build on meta, hold and load only chosen sub-layers, read only their checkpoint tensors."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from elastic_pipe.models import (
    LlamaConfig,
    ModelError,
    TensorReader,
    gpt_config,
    gpt_decoder,
    hold_only,
    llama_config,
    llama_decoder,
    llama_weight_map,
    load_sublayers,
    materialize,
    materialize_from_safetensors,
    meta_build,
    next_token_loss,
    open_safetensors,
    release,
    resident_sublayers,
    shared_parameters,
)
from elastic_pipe.models.gpt import gpt_layers
from elastic_pipe.models.llama import llama_model
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends

safetensors_torch = pytest.importorskip("safetensors.torch")


def _hf_state(model: SubLayerModel, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """``model``'s weights under Hugging Face's LlamaForCausalLM names (what a checkpoint on disk holds)."""
    own = model.state_dict()
    return {theirs: own[ours].clone() for ours, theirs in llama_weight_map(config).items()}


def _checkpoint(tmp_path: Path, tied: bool = False) -> tuple[LlamaConfig, SubLayerModel, Path]:
    config = llama_config("llama-tiny", depth=3, tie_embeddings=tied)
    full = llama_decoder(config, seed=5, dtype=torch.float64)
    with torch.no_grad():  # non-trivial norms, so a wrongly loaded norm shows
        for name, param in full.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(_hf_state(full, config), path)
    return config, full, path


class CountingReader:
    """Records every tensor read through it."""

    def __init__(self, inner: TensorReader) -> None:
        self.inner = inner
        self.read: list[str] = []

    def keys(self) -> Iterable[str]:
        return self.inner.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        self.read.append(name)
        return self.inner.get_tensor(name)


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def test_meta_build_holds_no_storage() -> None:
    model = meta_build(lambda: llama_model(llama_config("llama-3-8b")))
    assert all(p.is_meta for p in model.parameters())
    assert resident_sublayers(model) == ()


def test_materialize_two_sublayers_reads_only_their_tensors(tmp_path: Path) -> None:
    config, full, path = _checkpoint(tmp_path)
    weight_map = llama_weight_map(config)
    model = meta_build(lambda: llama_model(config))
    materialize(model, {0, 1}, "cpu", dtype=torch.float64)
    with open_safetensors(path) as file:
        reader = CountingReader(file)
        read = load_sublayers(model, {0, 1}, reader, weight_map)
    expected = ["model.embed_tokens.weight"] + [
        f"model.layers.0.{name}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "input_layernorm")
    ]
    assert reader.read == list(read)
    assert sorted(read) == sorted(f"{k}.weight" if k.startswith("model.layers") else k for k in expected)
    assert resident_sublayers(model) == (0, 1)
    for i in range(2, model.num_sublayers):
        assert all(t.is_meta for t in _tensors(model[i])), model.layer_names[i]
    for i in (0, 1):
        for (name, mine), theirs in zip(model[i].named_parameters(), full[i].parameters(), strict=True):
            assert mine.dtype == torch.float64 and torch.equal(mine, theirs), name
    tokens = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.slice(0, 2)(tokens), full.slice(0, 2)(tokens))


def test_unneeded_tensors_are_never_touched(tmp_path: Path) -> None:
    config, full, _ = _checkpoint(tmp_path)
    state = _hf_state(full, config)
    state["model.layers.2.mlp.up_proj.weight"] = torch.zeros(1)  # corrupt: wrong shape
    del state["model.norm.weight"]  # absent
    path = tmp_path / "broken.safetensors"
    safetensors_torch.save_file(state, path)
    model = meta_build(lambda: llama_model(config))
    read = materialize_from_safetensors(model, [1, 2, 3], path, llama_weight_map(config), dtype=torch.float64)
    assert len(read) == 5 + 4 + 5 and resident_sublayers(model) == (1, 2, 3)
    with pytest.raises(ModelError, match=r"'model.layers.2.mlp.up_proj.weight' has shape \(1,\)"):
        materialize_from_safetensors(model, [6], path, llama_weight_map(config))
    with pytest.raises(ModelError, match=r"no tensor 'model\.norm\.weight'"):
        materialize_from_safetensors(model, [7], path, llama_weight_map(config))


def test_release_frees_and_rematerializes(tmp_path: Path) -> None:
    config, full, path = _checkpoint(tmp_path)
    model = meta_build(lambda: llama_model(config))
    weight_map = llama_weight_map(config)
    materialize_from_safetensors(model, range(4), path, weight_map, dtype=torch.float64)
    model[1].q_proj.weight.grad = torch.ones_like(model[1].q_proj.weight)
    release(model, [0, 1])
    assert resident_sublayers(model) == (2, 3)
    assert all(t.is_meta for t in _tensors(model[1])) and model[1].q_proj.weight.grad is None
    materialize_from_safetensors(model, [5, 6, 7], path, weight_map, dtype=torch.float64)  # the stage moved
    assert resident_sublayers(model) == (2, 3, 5, 6, 7)
    for i in (2, 3, 5, 6, 7):
        for mine, theirs in zip(model[i].parameters(), full[i].parameters(), strict=True):
            assert torch.equal(mine, theirs)


def test_tied_embedding_is_shared_and_kept_while_used(tmp_path: Path) -> None:
    config, full, path = _checkpoint(tmp_path, tied=True)
    model = meta_build(lambda: llama_model(config))
    head = model.num_sublayers - 1
    assert shared_parameters(model) == (("embed.tokens.weight", "head.proj.weight"),)
    read = materialize_from_safetensors(model, [0], path, llama_weight_map(config), dtype=torch.float64)
    assert read == ("model.embed_tokens.weight",)
    assert model[head].proj.weight is model[0].tokens.weight  # one tensor; the head's norm is still meta
    assert resident_sublayers(model) == (0,)
    read = materialize_from_safetensors(model, [head], path, llama_weight_map(config), dtype=torch.float64)
    assert read == ("model.norm.weight",)  # the tied matrix is already there
    release(model, [head])
    assert not model[0].tokens.weight.is_meta and model[head].proj.weight is model[0].tokens.weight
    assert torch.equal(model[0].tokens.weight, full[0].tokens.weight)
    release(model, [0])
    assert model[head].proj.weight.is_meta and resident_sublayers(model) == ()


def test_two_stages_reproduce_the_whole_model_step(tmp_path: Path) -> None:
    """Two ranks' worth of residency: each holds half, gradients equal the full model's (tied: after summing)."""
    config, full, path = _checkpoint(tmp_path, tied=True)
    weight_map, cut = llama_weight_map(config), 4
    stages = [meta_build(lambda: llama_model(config)) for _ in range(2)]
    for stage, part in zip(stages, (range(cut), range(cut, full.num_sublayers)), strict=True):
        materialize_from_safetensors(stage, part, path, weight_map, dtype=torch.float64)
    tokens = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    boundary = stages[0].slice(0, cut)(tokens)
    received = boundary.detach().requires_grad_()
    next_token_loss(stages[1].slice(cut, full.num_sublayers)(received), tokens).backward()
    boundary.backward(received.grad)
    next_token_loss(full(tokens), tokens).backward()
    for group in shared_parameters(full):  # what the orchestrator all-reduces between the two ranks
        grads = [stage.get_parameter(name).grad for stage in stages for name in group[:1]]
        total = sum(g for g in grads if g is not None)
        torch.testing.assert_close(total, full.get_parameter(group[0]).grad, rtol=0, atol=1e-12)
    for i in range(1, full.num_sublayers - 1):
        stage = stages[0] if i < cut else stages[1]
        for mine, theirs in zip(stage[i].parameters(), full[i].parameters(), strict=True):
            assert mine.grad is not None and theirs.grad is not None
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=1e-12)


def test_sharded_directory_and_any_sublayer_model(tmp_path: Path) -> None:
    """A GPT decoder saved under its own names, in two shards, loads through an identity weight map."""
    model = gpt_decoder("gpt-tiny", seed=2)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    keys = sorted(state)
    shards = {"a.safetensors": keys[: len(keys) // 2], "b.safetensors": keys[len(keys) // 2 :]}
    for file, names in shards.items():
        safetensors_torch.save_file({k: state[k] for k in names}, tmp_path / file)
    index = {"weight_map": {k: file for file, names in shards.items() for k in names}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    cfg = gpt_config("gpt-tiny")
    stage = meta_build(lambda: SubLayerModel(gpt_layers(cfg), block_unit_ends(cfg.depth)))
    last = model.num_sublayers - 1
    read = materialize_from_safetensors(stage, [last - 1, last], tmp_path, {k: k for k in state})
    assert {k.split(".", 1)[0] for k in read} == {"block1_mlp", "head"}
    assert resident_sublayers(stage) == (last - 1, last)
    for mine, theirs in zip(stage[last].parameters(), model[last].parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_errors_name_the_problem(tmp_path: Path) -> None:
    config, _, path = _checkpoint(tmp_path)
    model = meta_build(lambda: llama_model(config))
    with pytest.raises(ModelError, match=r"in \[0, 8\), got \[8\]"):
        materialize(model, [8])
    with pytest.raises(ModelError, match=r"materialize\(2\) first"), open_safetensors(path) as reader:
        load_sublayers(model, [2], reader, llama_weight_map(config))
    materialize(model, [2])
    with pytest.raises(ModelError, match=r"no entry for 'block0_mlp\.norm\.weight'"), open_safetensors(path) as r:
        load_sublayers(model, [2], r, {})
    with pytest.raises(ModelError, match="no safetensors checkpoint"), open_safetensors(tmp_path / "nowhere"):
        pass


def test_hold_only_follows_a_repartition(tmp_path: Path) -> None:
    """The head's rank of a tied model: its stage grows, then moves; trained values of kept sub-layers survive."""
    config, full, path = _checkpoint(tmp_path, tied=True)
    model, weight_map, head = meta_build(lambda: llama_model(config)), llama_weight_map(config), 7
    hold_only(model, [6, head], path, weight_map, dtype=torch.float64)
    assert resident_sublayers(model) == (0, 6, head)  # the embedding's only tensor is the tied matrix
    with torch.no_grad():
        model[6].norm.weight.add_(1.0)  # "training"
    read = hold_only(model, [4, 5, 6], path, weight_map, dtype=torch.float64)
    new = [v for k, v in weight_map.items() if k.split(".")[0] in ("block1_mlp", "block2_attn")]  # 4 and 5
    assert sorted(read) == sorted(new) and len(new) == 4 + 5
    assert resident_sublayers(model) == (4, 5, 6)
    assert model[0].tokens.weight.is_meta and model[head].proj.weight.is_meta  # the tied matrix is freed
    assert torch.equal(model[6].norm.weight, full[6].norm.weight + 1.0)
