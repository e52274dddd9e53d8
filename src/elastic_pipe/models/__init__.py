"""Models at sub-layer granularity (ViT, BERT-style encoder, GPT- and Llama-style decoders) and adapters that turn
torchvision and Hugging Face models into ordered sub-layer lists.

Every model is a :class:`SubLayerModel`: an ``nn.Sequential`` of sub-layers that each take one tensor and return
one tensor, plus ``unit_ends``, the freezable units (transformer blocks) as sub-layer end offsets.
:mod:`~elastic_pipe.models.residency` builds one on the meta device and materializes only the sub-layers a rank
runs; :mod:`~elastic_pipe.models.weights` says where their values come from (every builder's ``meta=True``).

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.models.bert import BERT_PRESETS, BertConfig, bert_config, bert_encoder
from elastic_pipe.models.costs import SubLayerProfile, analyze, attention_flops, sublayer_costs
from elastic_pipe.models.errors import ModelError, ModelTypeError
from elastic_pipe.models.gpt import GPT_PRESETS, GPTConfig, gpt_config, gpt_decoder
from elastic_pipe.models.hf import from_hf, from_hf_checkpoint, from_hf_state
from elastic_pipe.models.hf_export import to_hf
from elastic_pipe.models.layers import (
    ACTIVATIONS,
    AttentionSubLayer,
    ClassifierHead,
    LMHead,
    MLPSubLayer,
    PatchEmbedding,
    TokenEmbedding,
    next_token_loss,
)
from elastic_pipe.models.llama import (
    LLAMA_PRESETS,
    LlamaConfig,
    llama_config,
    llama_config_from_hf,
    llama_decoder,
    llama_model,
    llama_weight_map,
)
from elastic_pipe.models.minilm import load_minilm, minilm_dir, minilm_tokenize
from elastic_pipe.models.residency import (
    MappingReader,
    TensorReader,
    WeightMap,
    hold_only,
    load_sublayers,
    materialize,
    materialize_from_safetensors,
    meta_build,
    open_safetensors,
    release,
    resident_sublayers,
    safetensors_meta,
    shared_parameters,
)
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends
from elastic_pipe.models.torchvision_vit import from_torchvision_vit
from elastic_pipe.models.vit import VIT_PRESETS, ViTConfig, vit, vit_config
from elastic_pipe.models.weights import (
    CheckpointInit,
    MaterializeError,
    MissingInit,
    SeededInit,
    SubLayerInit,
    check_materializable,
    materialize_sublayers,
    sublayer_seed,
)

__all__ = [
    "ACTIVATIONS",
    "BERT_PRESETS",
    "GPT_PRESETS",
    "LLAMA_PRESETS",
    "VIT_PRESETS",
    "AttentionSubLayer",
    "BertConfig",
    "CheckpointInit",
    "ClassifierHead",
    "GPTConfig",
    "LMHead",
    "LlamaConfig",
    "MLPSubLayer",
    "MappingReader",
    "MaterializeError",
    "MissingInit",
    "ModelError",
    "ModelTypeError",
    "PatchEmbedding",
    "SeededInit",
    "SubLayerInit",
    "SubLayerModel",
    "SubLayerProfile",
    "TensorReader",
    "TokenEmbedding",
    "ViTConfig",
    "WeightMap",
    "analyze",
    "attention_flops",
    "bert_config",
    "bert_encoder",
    "block_unit_ends",
    "check_materializable",
    "from_hf",
    "from_hf_checkpoint",
    "from_hf_state",
    "from_torchvision_vit",
    "gpt_config",
    "gpt_decoder",
    "hold_only",
    "llama_config",
    "llama_config_from_hf",
    "llama_decoder",
    "llama_model",
    "llama_weight_map",
    "load_minilm",
    "load_sublayers",
    "materialize",
    "materialize_from_safetensors",
    "materialize_sublayers",
    "meta_build",
    "minilm_dir",
    "minilm_tokenize",
    "next_token_loss",
    "open_safetensors",
    "release",
    "resident_sublayers",
    "safetensors_meta",
    "shared_parameters",
    "sublayer_costs",
    "sublayer_seed",
    "to_hf",
    "vit",
    "vit_config",
]
