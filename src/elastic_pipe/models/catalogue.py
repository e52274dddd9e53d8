"""The model catalogue: the published presets as plain :class:`~elastic_pipe.types.TransformerShape` records.

Each model's facts (width, depth, heads, vocabulary, positions, image and patch size) are stated once, in the preset
tables of :mod:`~elastic_pipe.models.vit`, :mod:`~elastic_pipe.models.bert` and :mod:`~elastic_pipe.models.gpt`
that build the modules; this module only reads them. The shapes are what the analytic cost models take (the
partition package's :func:`~elastic_pipe.partition.transformer_costs`, the planner's work counts), so a cost model
and the module it describes cannot disagree about the model.

Text models are catalogued at their published training length: BERT at its 512 positions, GPT-2 at its 1,024.
"""

from __future__ import annotations

from elastic_pipe.models.bert import BERT_PRESETS, BertConfig
from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.gpt import GPT_PRESETS, GPTConfig
from elastic_pipe.models.vit import VIT_PRESETS, ViTConfig
from elastic_pipe.types import TransformerShape

__all__ = ["CATALOGUE", "MODEL_SHAPES", "model_shape", "shape_of"]


def shape_of(config: ViTConfig | BertConfig | GPTConfig, name: str, *, seq_len: int | None = None) -> TransformerShape:
    """The shape of a model config, named ``name``.

    Args:
        config: a ViT, BERT or GPT config (a preset or a custom one).
        name: the shape's name.
        seq_len: tokens per sample of a text model; default its full position table. A ViT's length follows from
            its image and patch size.

    Raises:
        ModelError: ``seq_len`` given for a ViT.
        ElasticPipeError: the resulting shape is invalid (e.g. ``seq_len`` beyond the position table).
    """
    if isinstance(config, ViTConfig):
        if seq_len is not None:
            raise ModelError(f"a ViT's sequence length follows from image and patch; got seq_len={seq_len}")
        return TransformerShape(
            name,
            "vit",
            config.depth,
            config.dim,
            config.heads,
            config.mlp_dim,
            config.seq_len,
            positions=config.seq_len,
            image=config.image_size,
            patch=config.patch_size,
            channels=config.in_channels,
            classes=config.num_classes,
        )
    family = "bert" if isinstance(config, BertConfig) else "gpt"
    return TransformerShape(
        name,
        family,
        config.depth,
        config.dim,
        config.heads,
        config.mlp_dim,
        config.max_positions if seq_len is None else seq_len,
        vocab=config.vocab_size,
        positions=config.max_positions,
        type_vocab=config.type_vocab_size if isinstance(config, BertConfig) else 0,
    )


#: Catalogue name -> the preset it reads. The published models by the names the planner and the docs use
#: (GPT-2 small is the ``"gpt2"`` preset).
CATALOGUE: dict[str, ViTConfig | BertConfig | GPTConfig] = {
    "vit-b16": VIT_PRESETS["vit-b16"],
    "vit-l16": VIT_PRESETS["vit-l16"],
    "bert-base": BERT_PRESETS["bert-base"],
    "bert-large": BERT_PRESETS["bert-large"],
    "gpt2-small": GPT_PRESETS["gpt2"],
    "gpt2-medium": GPT_PRESETS["gpt2-medium"],
    "gpt2-large": GPT_PRESETS["gpt2-large"],
    "gpt2-xl": GPT_PRESETS["gpt2-xl"],
}

#: The catalogued shapes by name.
MODEL_SHAPES: dict[str, TransformerShape] = {name: shape_of(config, name) for name, config in CATALOGUE.items()}


def model_shape(name: str) -> TransformerShape:
    """The catalogued shape ``name`` (see :data:`MODEL_SHAPES`).

    Raises:
        ModelError: unknown name (the message lists the valid ones).
    """
    try:
        return MODEL_SHAPES[CHECK.str("model name", name)]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; expected one of {sorted(MODEL_SHAPES)}") from None
