"""On 4 gloo ranks (pipe_len 4) the trainer builds the model on the meta device and each rank materializes only
its own sub-layers: right after setup a rank's parameter bytes are its stage's share, the values equal the model
one process builds whole, and from a safetensors checkpoint a rank reads its own tensors and no others."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from elastic_pipe.orchestrator import config_from_tables
from elastic_pipe.testing import RankContext, run_distributed

#: A ViT with 10 sub-layers, float64, cut into 4 stages by parameter count.
VIT = {"preset": "vit-tiny", "depth": 4, "dim": 32, "heads": 2, "mlp_dim": 64, "patch_size": 4}
#: The BERT checkpoint the safetensors run reads (2 blocks: 6 sub-layers, so every stage has one or two).
BERT = {"depth": 2, "dim": 32, "heads": 2, "mlp_dim": 64}


def _tables(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": model,
        "data": {"eval_fraction": 0.5},
        "train": {"epochs": 1, "dtype": "float64", "global_batch": 16, "optimizer": "adamw"},
        "freeze": {"policy": "never"},
        "pipeline": {"microbatches": 2, "pipe_len": 4, "solver": "optimal", "cache": "off"},
        "launch": {"nproc_per_node": 4},
        "log": {"progress": False},
    }


def _held(trainer: Any, whole: dict[str, Any]) -> dict[str, Any]:
    """What this rank holds right after setup (the first layout entered, no step taken), and the keys where it
    differs from ``whole``, the model's state dict built whole in one process."""
    import torch

    ctx = trainer.ctx
    held = ctx.held(trainer.state.layout)
    state = ctx.model.state_dict(keep_vars=True)
    return {
        "held": list(held),
        "bytes": sum(p.numel() * p.element_size() for p in ctx.model.parameters() if not p.is_meta),
        "share": sum(ctx.param_bytes[j] for j in held),
        "whole": sum(ctx.param_bytes),
        "sublayers": len(ctx.sublayers),
        "compared": sum(1 for t in state.values() if not t.is_meta),
        "differ": [k for k, t in state.items() if not t.is_meta and not torch.equal(t.detach(), whole[k])],
    }


def _write_bert(directory: Path) -> None:
    from safetensors.torch import save_file

    from elastic_pipe import models
    from elastic_pipe.models.hf_export import bert_hf_map, scatter_hf

    source = models.bert_encoder(num_classes=None, seed=11, **BERT)
    save_file(scatter_hf(bert_hf_map(2, prefix="bert."), source.state_dict()), str(directory / "model.safetensors"))
    cfg = models.bert_config("bert-tiny", **BERT)
    config = {
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_positions,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")


def _setup_only(ctx: RankContext, directory: str) -> dict[str, Any]:
    import safetensors
    import torch

    from elastic_pipe import models
    from elastic_pipe.orchestrator import ElasticTrainer
    from elastic_pipe.orchestrator.components import build_model

    out: dict[str, Any] = {}
    config = config_from_tables(_tables({"name": "vit", "options": VIT}))
    with ElasticTrainer(config, quiet=True) as trainer:
        assert all(p.is_meta for p in trainer.parts.model.parameters())  # built on meta
        trainer.start()
        out["vit"] = _held(trainer, build_model(config).state_dict())

    # the model built whole in one process from the same checkpoint, before the spy goes in
    whole = models.from_hf_checkpoint(directory, num_classes=4, seed=3, dtype=torch.float64).state_dict()
    read: list[str] = []
    real = safetensors.safe_open

    class Spy:  # every tensor this rank reads from the checkpoint
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.inner = real(*args, **kwargs)

        def __enter__(self) -> Spy:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: Any) -> None:
            self.inner.__exit__(*exc)

        def keys(self) -> Any:
            return self.inner.keys()

        def get_tensor(self, name: str) -> torch.Tensor:
            read.append(name)
            return self.inner.get_tensor(name)

    safetensors.safe_open = Spy  # type: ignore[misc]
    try:
        model = models.from_hf_checkpoint(directory, num_classes=4, seed=3, dtype=torch.float64, meta=True)
        gen = torch.Generator().manual_seed(0)
        data = SimpleNamespace(
            inputs=torch.randint(1, 100, (32, 8), generator=gen),
            labels=torch.randint(0, 4, (32,), generator=gen),
            sample_ids=torch.arange(32),
        )
        tables = _tables({"name": "bert"})
        with ElasticTrainer(config_from_tables(tables), model=model, data=data, quiet=True) as trainer:
            trainer.start()
            out["bert"] = _held(trainer, whole)
            out["bert"]["read"] = list(read)
            out["bert"]["keys"] = trainer.ctx.sublayer_keys
    finally:
        safetensors.safe_open = real  # type: ignore[misc]
    return out


@pytest.mark.distributed
@pytest.mark.slow  # two 4-rank setups, ~30 s on 2 shared cores
def test_each_rank_materializes_and_reads_only_its_own_sub_layers(tmp_path: Path) -> None:

    from elastic_pipe.models.hf_export import bert_hf_map

    _write_bert(tmp_path)
    results = run_distributed(_setup_only, 4, str(tmp_path), timeout=300)
    table = bert_hf_map(2, prefix="bert.")
    for name in ("vit", "bert"):
        held = [r[name]["held"] for r in results]
        assert sorted(j for h in held for j in h) == list(range(results[0][name]["sublayers"]))  # each on one rank
        assert sum(r[name]["bytes"] for r in results) == results[0][name]["whole"]
        for rank, r in enumerate(results):
            mine = r[name]
            # right after setup: the stage's share of the parameter bytes, never the whole model
            assert mine["bytes"] == pytest.approx(mine["share"], rel=0.1), (name, rank)
            assert 0 < mine["bytes"] < mine["whole"], (name, rank)
            if name == "vit":  # balanced stages: about a quarter each
                assert mine["bytes"] < 0.5 * mine["whole"], rank
            # ... with exactly the values one process builds whole
            assert mine["compared"] > 0 and mine["differ"] == [], (name, rank)
    # the safetensors run: each rank read its own sub-layers' tensors, each once, and nothing else
    for rank, r in enumerate(results):
        bert = r["bert"]
        ours = [k for j in bert["held"] for k in bert["keys"][j]]
        expected = sorted(k for key in ours if key in table for k in table[key].keys)
        assert sorted(bert["read"]) == expected, rank
    everything = sorted(k for r in results for k in r["bert"]["read"])
    assert everything == sorted(k for src in table.values() for k in src.keys)  # each tensor read by one rank
