"""Models at sub-layer granularity (ViT, BERT-style encoder, GPT-style decoder) and adapters that turn torchvision
and Hugging Face models into ordered sub-layer lists.

Every model is a :class:`SubLayerModel`: an ``nn.Sequential`` of sub-layers that each take one tensor and return
one tensor, plus ``unit_ends``, the freezable units (transformer blocks) as sub-layer end offsets.

This package imports no other elastic_pipe primitive; it may use :mod:`elastic_pipe.types`.
"""

from __future__ import annotations

from elastic_pipe.models.bert import BERT_PRESETS, BertConfig, bert_config, bert_encoder
from elastic_pipe.models.costs import SubLayerProfile, analyze, attention_flops, sublayer_costs
from elastic_pipe.models.errors import ModelError
from elastic_pipe.models.gpt import GPT_PRESETS, GPTConfig, gpt_config, gpt_decoder
from elastic_pipe.models.hf import from_hf, from_hf_checkpoint, from_hf_state
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
from elastic_pipe.models.minilm import load_minilm, minilm_dir, minilm_tokenize
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends
from elastic_pipe.models.torchvision_vit import from_torchvision_vit
from elastic_pipe.models.vit import VIT_PRESETS, ViTConfig, vit, vit_config

__all__ = [
    "ACTIVATIONS",
    "BERT_PRESETS",
    "GPT_PRESETS",
    "VIT_PRESETS",
    "AttentionSubLayer",
    "BertConfig",
    "ClassifierHead",
    "GPTConfig",
    "LMHead",
    "MLPSubLayer",
    "ModelError",
    "PatchEmbedding",
    "SubLayerModel",
    "SubLayerProfile",
    "TokenEmbedding",
    "ViTConfig",
    "analyze",
    "attention_flops",
    "bert_config",
    "bert_encoder",
    "block_unit_ends",
    "from_hf",
    "from_hf_checkpoint",
    "from_hf_state",
    "from_torchvision_vit",
    "gpt_config",
    "gpt_decoder",
    "load_minilm",
    "minilm_dir",
    "minilm_tokenize",
    "next_token_loss",
    "sublayer_costs",
    "vit",
    "vit_config",
]
