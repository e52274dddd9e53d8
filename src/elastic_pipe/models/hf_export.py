"""The way back: a :class:`SubLayerModel` that came from a Hugging Face adapter, as a transformers model again.

Each supported family has one name table, ``our state-dict key -> HFSource`` (the Hugging Face keys a tensor is
built from and how); :mod:`elastic_pipe.models.hf` reads checkpoints through the same tables (Llama through
:func:`elastic_pipe.models.llama.llama_weight_map`), so the mapping lives once and :func:`to_hf` only inverts it:
a fused query/key/value matrix is split back into its parts, a GPT-2 ``Conv1D`` weight is transposed back.

transformers is imported only inside :func:`to_hf`; the tables need nothing but ``torch``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.llama import llama_config_from_hf, llama_weight_map
from elastic_pipe.models.sublayer import SubLayerModel

__all__ = [
    "HF_EXPORT_FAMILIES",
    "HFSource",
    "bert_hf_map",
    "gather_hf",
    "gpt2_hf_map",
    "scatter_hf",
    "to_hf",
]


@dataclass(frozen=True, slots=True)
class HFSource:
    """Where one of our tensors lives in a Hugging Face state dict.

    Attributes:
        keys: the Hugging Face keys; several are concatenated along dim 0 (BERT's query, key and value become our
            fused ``qkv``), so they must have equal first dimensions.
        transpose: each part is stored transposed (GPT-2's ``Conv1D`` keeps weights as (in, out)).
    """

    keys: tuple[str, ...]
    transpose: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ModelError("HFSource needs at least one Hugging Face key")


HFMap = dict[str, HFSource]


def _add(table: HFMap, ours: str, *theirs: str, transpose: bool = False, bias: bool = True) -> None:
    """Map ``ours.weight`` (and ``ours.bias`` with ``bias``) to the same tensors under each of ``theirs``."""
    table[f"{ours}.weight"] = HFSource(tuple(f"{t}.weight" for t in theirs), transpose)
    if bias:
        table[f"{ours}.bias"] = HFSource(tuple(f"{t}.bias" for t in theirs))


def bert_hf_map(
    depth: int, *, segments: bool = True, pooler: bool = False, classifier: bool = False, prefix: str = ""
) -> HFMap:
    """The BERT name table (``BertModel`` / ``BertForSequenceClassification``).

    Args:
        depth: number of encoder layers.
        segments: the model has token-type embeddings (``type_vocab_size > 0``).
        pooler: include the dense + tanh pooler.
        classifier: include the sequence-classification head (``classifier``, never prefixed).
        prefix: the base model's prefix (``"bert."`` inside ``BertForSequenceClassification``, ``""`` for
            ``BertModel``).
    """
    p, t = prefix, HFMap()
    t["embed.tokens.weight"] = HFSource((f"{p}embeddings.word_embeddings.weight",))
    t["embed.positions.weight"] = HFSource((f"{p}embeddings.position_embeddings.weight",))
    if segments:
        t["embed.segments.weight"] = HFSource((f"{p}embeddings.token_type_embeddings.weight",))
    _add(t, "embed.norm", f"{p}embeddings.LayerNorm")
    for i in range(depth):
        a, m, layer = f"block{i}_attn", f"block{i}_mlp", f"{p}encoder.layer.{i}"
        _add(t, f"{a}.qkv", *(f"{layer}.attention.self.{n}" for n in ("query", "key", "value")))
        _add(t, f"{a}.proj", f"{layer}.attention.output.dense")
        _add(t, f"{a}.norm", f"{layer}.attention.output.LayerNorm")
        _add(t, f"{m}.fc1", f"{layer}.intermediate.dense")
        _add(t, f"{m}.fc2", f"{layer}.output.dense")
        _add(t, f"{m}.norm", f"{layer}.output.LayerNorm")
    if pooler:
        _add(t, "head.pooler", f"{p}pooler.dense")
    if classifier:
        _add(t, "head.classifier", "classifier")
    return t


def gpt2_hf_map(depth: int, *, lm_head: bool = True, tied: bool = True, prefix: str = "") -> HFMap:
    """The GPT-2 name table (``GPT2Model`` / ``GPT2LMHeadModel``).

    Args:
        depth: number of blocks.
        lm_head: include our head's projection onto the vocabulary.
        tied: the projection is read from the token embedding ``wte`` (a tied checkpoint stores only that);
            ``False`` reads ``lm_head.weight``.
        prefix: the base model's prefix (``"transformer."`` inside ``GPT2LMHeadModel``, ``""`` for ``GPT2Model``).
    """
    p, t = prefix, HFMap()
    t["embed.tokens.weight"] = HFSource((f"{p}wte.weight",))
    t["embed.positions.weight"] = HFSource((f"{p}wpe.weight",))
    for i in range(depth):
        a, m, block = f"block{i}_attn", f"block{i}_mlp", f"{p}h.{i}"
        _add(t, f"{a}.qkv", f"{block}.attn.c_attn", transpose=True)
        _add(t, f"{a}.proj", f"{block}.attn.c_proj", transpose=True)
        _add(t, f"{a}.norm", f"{block}.ln_1")
        _add(t, f"{m}.fc1", f"{block}.mlp.c_fc", transpose=True)
        _add(t, f"{m}.fc2", f"{block}.mlp.c_proj", transpose=True)
        _add(t, f"{m}.norm", f"{block}.ln_2")
    _add(t, "head.norm", f"{p}ln_f")
    if lm_head:
        t["head.proj.weight"] = HFSource((f"{p}wte.weight",) if tied else ("lm_head.weight",))
    return t


def gather_hf(table: Mapping[str, HFSource], state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors from a Hugging Face state dict through ``table`` (the loading direction).

    Raises:
        ModelError: naming the first Hugging Face key the state dict lacks.
    """
    out: dict[str, torch.Tensor] = {}
    for ours, source in table.items():
        missing = [k for k in source.keys if k not in state_dict]
        if missing:
            raise ModelError(f"Hugging Face state dict has no {missing[0]!r} (needed for {ours!r})")
        parts = [state_dict[k].t() if source.transpose else state_dict[k] for k in source.keys]
        out[ours] = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out


def scatter_hf(table: Mapping[str, HFSource], state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face tensors from our state dict through ``table`` (the inverse of :func:`gather_hf`).

    Tensors are contiguous copies. Two of our tensors mapped to one Hugging Face key (GPT-2's tied embedding)
    must be equal.

    Raises:
        ModelError: if one of our tensors is missing, does not split evenly, or two writers of one key disagree.
    """
    out: dict[str, torch.Tensor] = {}
    for ours, source in table.items():
        if ours not in state_dict:
            raise ModelError(f"our state dict has no {ours!r} (needed for {list(source.keys)})")
        whole = state_dict[ours].detach()
        if whole.shape[0] % len(source.keys):
            raise ModelError(f"{ours!r} of shape {tuple(whole.shape)} does not split into {len(source.keys)} parts")
        for key, part in zip(source.keys, whole.chunk(len(source.keys)), strict=True):
            tensor = (part.t() if source.transpose else part).contiguous().clone()
            if key in out and not torch.equal(out[key], tensor):
                raise ModelError(f"{ours!r} and another tensor both map to {key!r} but differ")
            out[key] = tensor
    return out


#: The families :func:`to_hf` exports (Hugging Face ``model_type`` values).
HF_EXPORT_FAMILIES: tuple[str, ...] = ("bert", "gpt2", "llama")


def _load_config(hf_config: Any) -> Any:
    """A transformers config from a config object, a ``config.json`` dict, file or directory, or a hub name."""
    import transformers  # noqa: PLC0415 - optional dependency, only the export needs it

    if isinstance(hf_config, transformers.PretrainedConfig):
        return hf_config.__class__.from_dict(hf_config.to_dict())  # a copy: the tie flag may change below
    if isinstance(hf_config, Mapping):
        fields = dict(hf_config)
        if "model_type" not in fields:
            raise ModelError("a Hugging Face config dict needs 'model_type'")
        return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    if isinstance(hf_config, str | Path):
        path = Path(hf_config)
        if path.is_file():
            return _load_config(json.loads(path.read_text(encoding="utf-8")))
        return transformers.AutoConfig.from_pretrained(str(path))
    raise ModelError(f"expected a transformers config, a config dict or a path, got {type(hf_config).__name__}")


def _head(model: SubLayerModel) -> nn.Module:
    head = model[-1]
    assert isinstance(head, nn.Module)
    return head


def _plan(model: SubLayerModel, config: Any, ours: Mapping[str, torch.Tensor]) -> tuple[str, HFMap]:
    """``(auto class name, table)`` for ``model``; may set ``config.tie_word_embeddings`` / ``num_labels``."""
    model_type, head = config.model_type, _head(model)
    depth = config.num_hidden_layers
    if model_type == "bert":
        classifier = getattr(head, "classifier", None) is not None
        pooler = getattr(head, "pooler", None) is not None
        if classifier:
            if not pooler or getattr(head, "pooling", "first") != "first" or getattr(head, "normalize", False):
                raise ModelError(
                    "BertForSequenceClassification classifies the pooler output of the first token; this head "
                    "has no pooler, mean pooling or normalization"
                )
            config.num_labels = int(ours["head.classifier.weight"].shape[0])
        table = bert_hf_map(
            depth,
            segments="embed.segments.weight" in ours,
            pooler=pooler,
            classifier=classifier,
            prefix="bert." if classifier else "",
        )
        return ("AutoModelForSequenceClassification" if classifier else "AutoModel"), table
    if model_type == "gpt2":
        lm_head = "head.proj.weight" in ours
        tied = lm_head and torch.equal(ours["head.proj.weight"], ours["embed.tokens.weight"])
        if lm_head:
            # Training moved our untied copy away from the embedding: the exported model keeps both matrices.
            config.tie_word_embeddings = tied
        table = gpt2_hf_map(depth, lm_head=lm_head, tied=tied, prefix="transformer." if lm_head else "")
        return ("AutoModelForCausalLM" if lm_head else "AutoModel"), table
    if model_type == "llama":
        lm_head = "head.proj.weight" in ours
        ours_config = llama_config_from_hf(config, lm_head=lm_head)
        loaded = llama_weight_map(ours_config, prefix="model." if lm_head else "")
        return ("AutoModelForCausalLM" if lm_head else "AutoModel"), {k: HFSource((v,)) for k, v in loaded.items()}
    families = list(HF_EXPORT_FAMILIES)
    raise ModelError(f"cannot export Hugging Face model type {model_type!r}; expected one of {families}")


def to_hf(model: SubLayerModel, hf_config: Any) -> nn.Module:
    """The transformers model that ``model`` (from :func:`elastic_pipe.models.from_hf`) is a copy of, with its weights.

    The class follows the head: ``...ForSequenceClassification`` (BERT with a classifier; ``num_labels`` from it)
    or ``...ForCausalLM`` (GPT-2 / Llama with a projection onto the vocabulary), otherwise the base model. A tied
    Llama head stays tied; GPT-2's untied copy exports tied while it still equals the embedding and untied
    (``tie_word_embeddings=False``) once training has moved it. Weights are copies in ``model``'s dtype, on the CPU.

    Args:
        model: a :class:`SubLayerModel` that came from a Hugging Face BERT, GPT-2 or Llama model (or checkpoint).
        hf_config: the source's config: a transformers ``PretrainedConfig``, a ``config.json`` dict, the path of
            a ``config.json`` file, or a directory / hub name for ``AutoConfig.from_pretrained``.

    Returns:
        The transformers model in eval mode.

    Raises:
        ModelError: for an unsupported family, a head Hugging Face has no class for, or weights that do not fit.
    """
    CHECK.instance("model", model, SubLayerModel)
    import transformers  # noqa: PLC0415 - optional dependency, only the export needs it

    config = _load_config(hf_config)
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    auto, table = _plan(model, config, ours)
    theirs = scatter_hf(table, ours)
    dtype = next(iter(ours.values())).dtype
    # A base BertModel is built with a pooler only when ours has one (from_hf(..., pooler=False) drops it).
    base_bert = config.model_type == "bert" and auto == "AutoModel"
    kwargs = {"add_pooling_layer": "head.pooler.weight" in ours} if base_bert else {}
    hf_model: nn.Module = getattr(transformers, auto).from_config(config, **kwargs).to(dtype)
    expected = dict(hf_model.named_parameters())  # tied parameters appear once, under their first name
    unknown = sorted(set(theirs) - set(hf_model.state_dict()))
    missing = sorted(set(expected) - set(theirs))
    if unknown or missing:
        raise ModelError(f"weights do not fit {type(hf_model).__name__}: unknown {unknown[:3]}, missing {missing[:3]}")
    with torch.no_grad():
        state = hf_model.state_dict()
        for key, tensor in theirs.items():
            if state[key].shape != tensor.shape:
                raise ModelError(f"{key!r}: expected shape {tuple(state[key].shape)}, got {tuple(tensor.shape)}")
            state[key].copy_(tensor)
    return hf_model.eval()
