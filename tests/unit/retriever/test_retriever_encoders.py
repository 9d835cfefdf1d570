"""Encoders: family conventions, pooling, truncation, and the offline MiniLM against sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llds_retriever.encoders import BGE_QUERY_PREFIX, HFEncoder, pool, resolve_spec


def test_family_conventions() -> None:
    e5 = resolve_spec("intfloat/e5-base-v2")
    assert (e5.pooling, e5.query_prefix, e5.passage_prefix) == ("mean", "query: ", "passage: ")
    bge = resolve_spec("BAAI/bge-base-en-v1.5")
    assert (bge.pooling, bge.query_prefix, bge.passage_prefix) == ("cls", BGE_QUERY_PREFIX, "")
    mini = resolve_spec("minilm")
    assert (mini.pooling, mini.query_prefix) == ("mean", "")
    assert mini.path.endswith("model")
    custom = resolve_spec("intfloat/e5-base-v2", pooling="cls", query_prefix="")
    assert (custom.pooling, custom.query_prefix, custom.passage_prefix) == ("cls", "", "passage: ")


def test_pooling_hand_computed() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # [1, 3, 2]
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]


@pytest.fixture(scope="module")
def minilm() -> HFEncoder:
    torch.set_num_threads(1)
    return HFEncoder(resolve_spec("minilm"), max_length=16, device="cpu", jit=True)


def test_minilm_matches_sentence_transformers(minilm: HFEncoder) -> None:
    from sentence_transformers import SentenceTransformer

    texts = ["who wrote hamlet", "capital of france"]
    st = SentenceTransformer(minilm.spec.path, device="cpu")
    want = st.encode(texts, normalize_embeddings=True)
    got, truncated = minilm.encode_queries(texts)
    assert got.shape == (2, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert truncated == [False, False]


def test_e5_prefix_and_mean_pooling_logic(minilm: HFEncoder) -> None:
    """e5 conventions with MiniLM weights: query vector = normalised mean pool of "query: " + text."""
    e5 = HFEncoder(
        resolve_spec("minilm", query_prefix="query: ", passage_prefix="passage: "),
        max_length=64,
        device="cpu",
    )
    got, _ = e5.encode_queries(["who wrote hamlet"])
    tok = e5.tokenizer(["query: who wrote hamlet"], return_tensors="pt")
    with torch.no_grad():
        h = e5.model(**tok).last_hidden_state[0]  # [T, D]
    want = torch.nn.functional.normalize(h.mean(0), dim=-1).numpy()
    np.testing.assert_allclose(got[0], want, atol=1e-5)
    passage = e5.encode_passages(["Hamlet is a tragedy by Shakespeare."])
    direct = minilm._embed(["passage: Hamlet is a tragedy by Shakespeare."])
    np.testing.assert_allclose(passage, direct, atol=1e-5)


def test_long_queries_are_truncated_and_flagged(minilm: HFEncoder) -> None:
    long = "word " * 50
    vecs, truncated = minilm.encode_queries(["short one", long])
    assert truncated == [False, True]
    cut = minilm.tokenizer(long, truncation=True, max_length=16, return_tensors="pt")
    assert cut["input_ids"].shape[1] == 16
    assert np.isfinite(vecs).all()


def test_jit_equals_eager(minilm: HFEncoder) -> None:
    eager = HFEncoder(resolve_spec("minilm"), max_length=16, device="cpu", jit=False)
    texts = ["a", "a longer query with several more words in it"]
    np.testing.assert_allclose(minilm._embed(texts), eager._embed(texts), atol=1e-5)
