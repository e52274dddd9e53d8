"""Adapter: Hugging Face BERT / ViT / GPT-2 models to :class:`SubLayerModel`.

The adapter reads the Hugging Face model's ``state_dict`` and config and builds this package's own sub-layers with
the same weights, so every block is split into an attention and an MLP sub-layer (a pipeline may cut inside a
block) and nothing depends on Hugging Face's ``forward`` signatures, which change between releases. The result is
a copy: training it does not change the Hugging Face model. Tests check that the copy computes the same outputs as
the original (float64, tolerance 1e-10).

Supported: ``BertModel`` / ``BertForSequenceClassification`` (post-LN encoder), ``ViTModel`` /
``ViTForImageClassification`` (attribute layouts of transformers 4.x and 5.x), ``GPT2Model`` / ``GPT2LMHeadModel``
(GPT-2's tied output projection becomes an untied copy; see :mod:`elastic_pipe.models.gpt`), ``LlamaModel`` /
``LlamaForCausalLM`` (grouped-query attention, rotary positions, SwiGLU; a tied head stays tied, see
:mod:`elastic_pipe.models.llama`).

BERT and GPT-2 weights are read through the name tables of :mod:`elastic_pipe.models.hf_export` (Llama's through
:func:`elastic_pipe.models.llama.llama_weight_map`), whose :func:`~elastic_pipe.models.hf_export.to_hf` inverts
them to export a trained model back to transformers.

transformers itself is not imported here: the adapter only needs ``model.config``, ``model.state_dict()`` and
``model.base_model``, so it works with any installed version that keeps those names.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from elastic_pipe.models._build import build_loaded
from elastic_pipe.models.bert import BertConfig, bert_layers
from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.gpt import GPTConfig, gpt_layers
from elastic_pipe.models.hf_export import HFSource, bert_hf_map, gather_hf, gpt2_hf_map
from elastic_pipe.models.layers import ClassifierHead, LMHead, Pooling
from elastic_pipe.models.llama import (
    LLAMA_HF_DEFAULTS,
    llama_config_from_hf,
    llama_from_state,
    llama_model,
    llama_weight_map,
)
from elastic_pipe.models.residency import TensorReader, open_safetensors, safetensors_meta
from elastic_pipe.models.sublayer import SubLayerModel, block_unit_ends
from elastic_pipe.models.vit import ViTConfig, vit_layers
from elastic_pipe.models.weights import CheckpointInit, MissingInit, identity_map

__all__ = [
    "HF_ACTIVATIONS",
    "HF_BASE_PREFIXES",
    "HF_CONFIG_DEFAULTS",
    "HF_CONVERTERS",
    "LazyCheckpoint",
    "from_hf",
    "from_hf_checkpoint",
    "from_hf_state",
]

#: Hugging Face ``hidden_act`` / ``activation_function`` names and the activation in ``layers.ACTIVATIONS`` that
#: computes the same function.
HF_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}

StateDict = Mapping[str, torch.Tensor]


def _act(name: object) -> str:
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise ModelError(f"unsupported Hugging Face activation {name!r}; expected one of {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def _pick(sd: StateDict, *keys: str) -> torch.Tensor:
    """The first of ``keys`` present in ``sd`` (different transformers releases name the same weight differently)."""
    for key in keys:
        if key in sd:
            return sd[key]
    raise ModelError(f"Hugging Face state dict has none of {list(keys)}; is this a supported model layout?")


def _split_state(model: nn.Module) -> tuple[StateDict, StateDict]:
    """``(base, top)``: the base model's weights without its prefix, and the whole model's (for heads)."""
    top = model.state_dict()
    base_model = getattr(model, "base_model", model)
    if base_model is model:
        return top, top
    prefix = str(getattr(model, "base_model_prefix", "")) + "."
    return {k[len(prefix) :]: v for k, v in top.items() if k.startswith(prefix)}, top


WeightBias = tuple[torch.Tensor, torch.Tensor | None]


def _linear(target: dict[str, torch.Tensor], name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    target[f"{name}.weight"] = weight
    if bias is not None:
        target[f"{name}.bias"] = bias


def _pair(sd: StateDict, prefix: str) -> WeightBias:
    """``prefix``'s weight and bias, both required."""
    return sd[f"{prefix}.weight"], sd[f"{prefix}.bias"]


def _pick_pair(sd: StateDict, *prefixes: str) -> WeightBias:
    """The weight and the bias under the first of ``prefixes`` that has each (see :func:`_pick`)."""
    return _pick(sd, *(p + ".weight" for p in prefixes)), _pick(sd, *(p + ".bias" for p in prefixes))


def _norm(target: dict[str, torch.Tensor], name: str, sd: StateDict, *prefixes: str) -> None:
    _linear(target, name, *_pick_pair(sd, *prefixes))


def _block(
    target: dict[str, torch.Tensor],
    index: int,
    *,
    qkv: WeightBias,
    proj: WeightBias,
    attn_norm: WeightBias,
    fc1: WeightBias,
    fc2: WeightBias,
    mlp_norm: WeightBias,
) -> None:
    """Store block ``index``'s weights under the names of its attention and MLP sub-layers."""
    a, m = f"block{index}_attn", f"block{index}_mlp"
    _linear(target, f"{a}.qkv", *qkv)
    _linear(target, f"{a}.proj", *proj)
    _linear(target, f"{a}.norm", *attn_norm)
    _linear(target, f"{m}.fc1", *fc1)
    _linear(target, f"{m}.fc2", *fc2)
    _linear(target, f"{m}.norm", *mlp_norm)


def _encoder_head(
    target: dict[str, torch.Tensor], base: StateDict, top: StateDict, use_pooler: bool, copy_classifier: bool
) -> None:
    """Copy an encoder's pooler and classifier when the head keeps them (see :func:`_head_options`)."""
    if use_pooler:
        _linear(target, "head.pooler", *_pair(base, "pooler.dense"))
    if copy_classifier:
        _linear(target, "head.classifier", *_pair(top, "classifier"))


def _dtype(model: nn.Module) -> torch.dtype:
    param = next(model.parameters(), None)
    return param.dtype if param is not None else torch.float32


def _head_options(
    sd_top: StateDict, base: StateDict, num_classes: int | None, pooler: bool | None
) -> tuple[int | None, bool, bool]:
    """``(num_classes, use_pooler, copy_classifier)`` from the model's own head and the caller's wishes."""
    has_classifier = "classifier.weight" in sd_top
    if num_classes is None and has_classifier:
        num_classes = int(sd_top["classifier.weight"].shape[0])
    copy_classifier = has_classifier and num_classes == int(sd_top["classifier.weight"].shape[0])
    has_pooler = "pooler.dense.weight" in base
    if pooler and not has_pooler:
        raise ModelError("pooler=True but the Hugging Face model has no pooler weights")
    use_pooler = has_pooler if pooler is None else pooler
    return num_classes, use_pooler, copy_classifier


class LazyCheckpoint:
    """A safetensors checkpoint that a converter reads only the header of: the model it builds stays on the meta
    device and reads each sub-layer's tensors when that sub-layer is materialized
    (:class:`~elastic_pipe.models.weights.CheckpointInit`).

    Args:
        path: the ``.safetensors`` file (or a directory :func:`~elastic_pipe.models.residency.open_safetensors`
            opens).
        keys: the checkpoint's tensor names.
        prefix: the base model's prefix (``"bert."``, ...): a name the converter uses with or without it is found
            under either form.
    """

    def __init__(self, path: Path, keys: Collection[str], prefix: str) -> None:
        self.path = path
        self.keys = set(keys)
        self.prefix = prefix

    def resolve(self, key: str) -> str:
        """The checkpoint's name for ``key`` (as given, with the prefix, or without it).

        Raises:
            ModelError: the checkpoint holds none of them.
        """
        p = self.prefix
        for candidate in (key, p + key, key[len(p) :] if key.startswith(p) else key):
            if candidate in self.keys:
                return candidate
        raise ModelError(f"checkpoint {str(self.path)!r} has no tensor {key!r}")

    def init(self, table: Mapping[str, HFSource], seed: int, missing: Collection[str]) -> CheckpointInit:
        """The recipe that reads our tensors through ``table`` (parts concatenated, transposed as it says);
        the ``missing`` ones it does not name (a new classifier) are drawn from ``seed`` (:class:`MissingInit`)."""
        resolved = {
            ours: HFSource(tuple(self.resolve(k) for k in src.keys), src.transpose) for ours, src in table.items()
        }

        @contextlib.contextmanager
        def open_reader() -> Iterator[TensorReader]:
            with open_safetensors(self.path) as reader:
                yield _TableReader(reader, resolved)

        return CheckpointInit(open_reader, identity_map(resolved), MissingInit(seed, missing))


class _TableReader:
    """Our tensors, each read from its Hugging Face parts (:class:`HFSource`) when asked for."""

    def __init__(self, reader: TensorReader, table: Mapping[str, HFSource]) -> None:
        self.reader = reader
        self.table = table

    def keys(self) -> Iterable[str]:
        return self.table.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        source = self.table[name]
        parts = [self.reader.get_tensor(k) for k in source.keys]
        parts = [t.t() if source.transpose else t for t in parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _finish(
    make_layers: Callable[[], list[tuple[str, nn.Module]]],
    depth: int,
    target: dict[str, torch.Tensor],
    dtype: torch.dtype,
    seed: int,
    *,
    table: Mapping[str, HFSource] | None = None,
    lazy: LazyCheckpoint | None = None,
) -> SubLayerModel:
    def factory() -> SubLayerModel:
        return SubLayerModel(make_layers(), block_unit_ends(depth))

    if lazy is None:
        # Weights the source lacks (a new classifier) get the seeded initialization; everything else is copied.
        model, _ = build_loaded(factory, target, seed, dtype)
        return model
    if table is None:
        raise ModelError("this Hugging Face model type cannot be read lazily (meta=True); load it with meta=False")
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = factory().to(dtype)
    own = model.state_dict(keep_vars=True)
    for key, value in target.items():  # meta tensors from the checkpoint's header: shapes only
        if key not in own or tuple(value.shape) != tuple(own[key].shape):
            raise ModelError(f"checkpoint tensor for {key!r} has shape {tuple(value.shape)}, which the model lacks")
    model.sublayer_init = lazy.init(table, seed, [k for k in own if k not in table])
    return model


def _from_bert(
    cfg: Any,
    base: StateDict,
    top: StateDict,
    dtype: torch.dtype,
    *,
    pooling: Pooling | None,
    pooler: bool | None,
    normalize: bool,
    num_classes: int | None,
    seed: int,
    lazy: LazyCheckpoint | None = None,
) -> SubLayerModel:
    if getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False):
        raise ModelError("only encoder BERT models are supported (is_decoder / add_cross_attention must be False)")
    if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
        raise ModelError(f"only absolute position embeddings are supported, got {cfg.position_embedding_type!r}")
    num_classes, use_pooler, copy_classifier = _head_options(top, base, num_classes, pooler)
    config = BertConfig(
        vocab_size=cfg.vocab_size,
        max_positions=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        num_classes=num_classes,
        dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers,
        heads=cfg.num_attention_heads,
        mlp_dim=cfg.intermediate_size,
        norm_first=False,
        act=_act(cfg.hidden_act),
        eps=cfg.layer_norm_eps,
        dropout=cfg.hidden_dropout_prob,
        attention_dropout=cfg.attention_probs_dropout_prob,
        pad_token_id=cfg.pad_token_id,
        pooling=pooling or "first",
        pooler=use_pooler,
        normalize=normalize,
    )
    # The classifier sits outside the base model; every other name is relative to it.
    table = bert_hf_map(
        config.depth, segments=config.type_vocab_size > 0, pooler=use_pooler, classifier=copy_classifier
    )
    t = gather_hf(table, {**base, **{k: v for k, v in top.items() if k.startswith("classifier.")}})
    return _finish(lambda: bert_layers(config), config.depth, t, dtype, seed, table=table, lazy=lazy)


def _from_vit(
    cfg: Any,
    base: StateDict,
    top: StateDict,
    dtype: torch.dtype,
    *,
    pooling: Pooling | None,
    pooler: bool | None,
    normalize: bool,
    num_classes: int | None,
    seed: int,
    lazy: LazyCheckpoint | None = None,
) -> SubLayerModel:
    if lazy is not None:
        raise ModelError("a ViT checkpoint cannot be read lazily (its qkv bias may be absent): use meta=False")
    num_classes, use_pooler, copy_classifier = _head_options(top, base, num_classes, pooler)
    if use_pooler and getattr(cfg, "pooler_act", "tanh") != "tanh":
        raise ModelError(f"only a tanh pooler is supported, got pooler_act={cfg.pooler_act!r}")
    image_size, patch_size = cfg.image_size, cfg.patch_size
    config = ViTConfig(
        image_size=image_size if isinstance(image_size, int) else image_size[0],
        patch_size=patch_size if isinstance(patch_size, int) else patch_size[0],
        in_channels=cfg.num_channels,
        num_classes=num_classes or 1,
        dim=cfg.hidden_size,
        depth=cfg.num_hidden_layers,
        heads=cfg.num_attention_heads,
        mlp_dim=cfg.intermediate_size,
        dropout=cfg.hidden_dropout_prob,
        attention_dropout=cfg.attention_probs_dropout_prob,
        eps=cfg.layer_norm_eps,
        act=_act(cfg.hidden_act),
    )

    def make_layers() -> list[tuple[str, nn.Module]]:
        head = ClassifierHead(
            config.dim,
            num_classes,
            final_norm=True,
            eps=config.eps,
            pooling=pooling or "first",
            pooler=use_pooler,
            normalize=normalize,
        )
        return [*vit_layers(config)[:-1], ("head", head)]

    t: dict[str, torch.Tensor] = {
        "embed.cls_token": base["embeddings.cls_token"],
        "embed.pos_embedding": base["embeddings.position_embeddings"],
    }
    _linear(
        t,
        "embed.proj",
        base["embeddings.patch_embeddings.projection.weight"],
        base["embeddings.patch_embeddings.projection.bias"],
    )
    for i in range(config.depth):
        new, old = f"layers.{i}.", f"encoder.layer.{i}."
        names = (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"))
        weights = [_pick(base, f"{new}attention.{n}.weight", f"{old}attention.attention.{o}.weight") for n, o in names]
        dim = config.dim
        biases = [
            _pick(base, f"{new}attention.{n}.bias", f"{old}attention.attention.{o}.bias")
            if getattr(cfg, "qkv_bias", True)
            else torch.zeros(dim)
            for n, o in names
        ]
        _block(
            t,
            i,
            qkv=(torch.cat(weights), torch.cat(biases)),
            proj=_pick_pair(base, f"{new}attention.o_proj", f"{old}attention.output.dense"),
            attn_norm=_pick_pair(base, f"{new}layernorm_before", f"{old}layernorm_before"),
            fc1=_pick_pair(base, f"{new}mlp.fc1", f"{old}intermediate.dense"),
            fc2=_pick_pair(base, f"{new}mlp.fc2", f"{old}output.dense"),
            mlp_norm=_pick_pair(base, f"{new}layernorm_after", f"{old}layernorm_after"),
        )
    _norm(t, "head.norm", base, "layernorm")
    _encoder_head(t, base, top, use_pooler, copy_classifier)
    return _finish(make_layers, config.depth, t, dtype, seed)


def _from_gpt2(
    cfg: Any,
    base: StateDict,
    top: StateDict,
    dtype: torch.dtype,
    *,
    pooling: Pooling | None,
    pooler: bool | None,
    normalize: bool,
    num_classes: int | None,
    seed: int,
    lazy: LazyCheckpoint | None = None,
) -> SubLayerModel:
    if pooling is not None or pooler or normalize or num_classes is not None:
        raise ModelError("GPT-2 has a language-model head: pooling, pooler, normalize and num_classes do not apply")
    if not getattr(cfg, "scale_attn_weights", True) or getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        raise ModelError("only GPT-2's default attention scaling (1/sqrt(head_dim)) is supported")
    if getattr(cfg, "add_cross_attention", False):
        raise ModelError("GPT-2 with cross-attention is not supported")
    # A GPT2LMHeadModel checkpoint on disk often omits lm_head.weight because it is tied to wte.
    has_lm_head = "lm_head.weight" in top or top is not base
    config = GPTConfig(
        vocab_size=cfg.vocab_size,
        max_positions=cfg.n_positions,
        dim=cfg.n_embd,
        depth=cfg.n_layer,
        heads=cfg.n_head,
        mlp_dim=cfg.n_inner or 4 * cfg.n_embd,
        act=_act(cfg.activation_function),
        eps=cfg.layer_norm_epsilon,
        dropout=cfg.resid_pdrop,
        attention_dropout=cfg.attn_pdrop,
    )

    def make_layers() -> list[tuple[str, nn.Module]]:
        head = LMHead(config.dim, config.vocab_size if has_lm_head else None, eps=config.eps)
        return [*gpt_layers(config)[:-1], ("head", head)]

    tied = "lm_head.weight" not in top
    table = gpt2_hf_map(config.depth, lm_head=has_lm_head, tied=tied)
    t = gather_hf(table, base if tied else {**base, "lm_head.weight": top["lm_head.weight"]})
    return _finish(make_layers, config.depth, t, dtype, seed, table=table, lazy=lazy)


def _from_llama(
    cfg: Any,
    base: StateDict,
    top: StateDict,
    dtype: torch.dtype,
    *,
    pooling: Pooling | None,
    pooler: bool | None,
    normalize: bool,
    num_classes: int | None,
    seed: int,
    lazy: LazyCheckpoint | None = None,
) -> SubLayerModel:
    del seed  # every weight comes from the source
    if pooling is not None or pooler or normalize or num_classes is not None:
        raise ModelError("Llama has a language-model head: pooling, pooler, normalize and num_classes do not apply")
    # As for GPT-2: a saved tied LlamaForCausalLM has no lm_head.weight, a base LlamaModel has no prefix.
    config = llama_config_from_hf(cfg, lm_head="lm_head.weight" in top or top is not base)
    if lazy is not None:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = llama_model(config).to(dtype)
        weight_map = {ours: lazy.resolve(theirs) for ours, theirs in llama_weight_map(config).items()}
        path = lazy.path
        model.sublayer_init = CheckpointInit(lambda: open_safetensors(path), weight_map)
        return model
    state = {f"model.{k}": v for k, v in base.items()}
    if "lm_head.weight" in top:
        state["lm_head.weight"] = top["lm_head.weight"]
    return llama_from_state(config, state, dtype)


Converter = Callable[..., SubLayerModel]

#: Hugging Face ``config.model_type`` -> converter.
HF_CONVERTERS: dict[str, Converter] = {"bert": _from_bert, "vit": _from_vit, "gpt2": _from_gpt2, "llama": _from_llama}


def _converter(model_type: Any) -> Converter:
    """The converter for ``model_type``.

    Raises:
        ModelError: for a type not in :data:`HF_CONVERTERS` (the message lists the supported ones).
    """
    if model_type not in HF_CONVERTERS:
        raise ModelError(f"unsupported Hugging Face model type {model_type!r}; expected one of {sorted(HF_CONVERTERS)}")
    return HF_CONVERTERS[model_type]


def from_hf(
    model: nn.Module,
    *,
    pooling: Pooling | None = None,
    pooler: bool | None = None,
    normalize: bool = False,
    num_classes: int | None = None,
    seed: int = 0,
) -> SubLayerModel:
    """Convert a Hugging Face BERT, ViT, GPT-2 or Llama model into a :class:`SubLayerModel` with the same weights.

    Args:
        model: a transformers model whose ``config.model_type`` is in :data:`HF_CONVERTERS` (a base model or one
            with a classification / language-model head).
        pooling: encoder heads only: ``"first"`` token (default, like Hugging Face) or ``"mean"`` of real tokens.
        pooler: encoder heads only: apply the model's dense + tanh pooler; default: if the model has one.
        normalize: encoder heads only: return unit-length vectors (sentence embeddings).
        num_classes: encoder heads only: classifier outputs. Default: the model's own classifier if it has one
            (copied), otherwise no classifier (the head returns the pooled vector). A number that differs from the
            model's own classifier gives a new classifier initialized from ``seed``.
        seed: initialization seed for weights the source does not have.

    Returns:
        A :class:`SubLayerModel` on the CPU in the source's dtype (move it with ``.to(device)``). The head
        returns what the source's head returns:
        ``logits`` for ``...ForSequenceClassification`` / ``...ForImageClassification`` / ``GPT2LMHeadModel`` /
        ``LlamaForCausalLM``, ``pooler_output`` for a base BERT / ViT with a pooler, otherwise the final hidden
        state of the first token (BERT / ViT, or the pooled vector with ``pooling="mean"``) or the final hidden
        states (GPT-2, Llama).

    Raises:
        ModelError: for an unsupported model type (listing the supported ones) or configuration.
    """
    CHECK.instance("model", model, nn.Module)
    convert = _converter(getattr(getattr(model, "config", None), "model_type", None))
    base, top = _split_state(model)
    return convert(
        model.config,
        base,
        top,
        _dtype(model),
        pooling=pooling,
        pooler=pooler,
        normalize=normalize,
        num_classes=num_classes,
        seed=seed,
    )


#: Hugging Face config defaults for fields a ``config.json`` may leave out (the transformers class defaults).
HF_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": {
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    },
    "vit": {
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-12,
        "num_channels": 3,
        "qkv_bias": True,
    },
    "gpt2": {
        "n_positions": 1024,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "layer_norm_epsilon": 1e-5,
    },
    "llama": LLAMA_HF_DEFAULTS,
}
#: The attribute under which each model type's ``...For...`` classes hold the base model.
HF_BASE_PREFIXES: dict[str, str] = {"bert": "bert", "vit": "vit", "gpt2": "transformer", "llama": "model"}


def from_hf_state(
    config: Mapping[str, Any],
    state_dict: StateDict,
    *,
    pooling: Pooling | None = None,
    pooler: bool | None = None,
    normalize: bool = False,
    num_classes: int | None = None,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    lazy: LazyCheckpoint | None = None,
) -> SubLayerModel:
    """Like :func:`from_hf`, from a Hugging Face ``config.json`` dict and a state dict (no transformers needed).

    Args:
        config: the parsed ``config.json`` (must contain ``model_type``).
        state_dict: the checkpoint's tensors, with or without the base-model prefix (``bert.``, ``vit.``,
            ``transformer.``, ``model.``).
        dtype: parameter dtype; default: the checkpoint's.
        lazy: ``state_dict`` holds the meta tensors of this checkpoint's header: build on the meta device with a
            recipe that reads each sub-layer's tensors from it when materialized (:func:`from_hf_checkpoint`).
        pooling, pooler, normalize, num_classes, seed: as in :func:`from_hf`.

    Raises:
        ModelError: for an unsupported model type or configuration.
    """
    CHECK.mapping("config", config)
    CHECK.mapping("state_dict", state_dict)
    model_type: Any = config.get("model_type")  # a key of HF_CONVERTERS once _converter accepts it
    convert = _converter(model_type)
    cfg = SimpleNamespace(**{**HF_CONFIG_DEFAULTS[model_type], **config})
    prefix = HF_BASE_PREFIXES[model_type] + "."
    top = dict(state_dict)
    base = {k[len(prefix) :]: v for k, v in top.items() if k.startswith(prefix)} or top
    if dtype is None:
        dtype = next(iter(top.values())).dtype if top else torch.float32
    return convert(
        cfg,
        base,
        top,
        dtype,
        pooling=pooling,
        pooler=pooler,
        normalize=normalize,
        num_classes=num_classes,
        seed=seed,
        lazy=lazy,
    )


def from_hf_checkpoint(directory: str | Path, *, meta: bool = False, **options: Any) -> SubLayerModel:
    """Load a Hugging Face checkpoint directory (``config.json`` + ``model.safetensors``) via :func:`from_hf_state`.

    Needs the ``safetensors`` package, not transformers. ``options`` are those of :func:`from_hf_state`.

    Args:
        directory: the checkpoint directory.
        meta: read only the checkpoint's header and build the model on the meta device; each sub-layer's tensors
            are read (only theirs) when it is materialized (:func:`~elastic_pipe.models.weights.
            materialize_sublayers`, what a trainer rank does for the sub-layers it holds). BERT, GPT-2 and Llama
            checkpoints; the values equal ``meta=False``'s.
        **options: those of :func:`from_hf_state`.

    Raises:
        ModelError: if the files are missing or the model is unsupported.
    """
    CHECK.instance("directory", directory, str | Path)
    path = Path(directory)
    config_file, weights_file = path / "config.json", path / "model.safetensors"
    for file in (config_file, weights_file):
        if not file.is_file():
            raise ModelError(f"Hugging Face checkpoint file {str(file)!r} does not exist")
    from safetensors.torch import load_file  # noqa: PLC0415 - optional dependency, only this loader needs it

    config = json.loads(config_file.read_text(encoding="utf-8"))
    if meta:
        header = safetensors_meta(weights_file)
        prefix = HF_BASE_PREFIXES.get(str(config.get("model_type")), "") + "."
        lazy = LazyCheckpoint(weights_file, header.keys(), prefix)
        return from_hf_state(config, header, lazy=lazy, **options)
    return from_hf_state(config, load_file(str(weights_file)), **options)
