"""Backends: shard merge, RRF fusion, BM25, and sharded dense search equal to unsharded."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from llds_retriever.backends import (
    BM25Backend,
    DenseBackend,
    Hits,
    merge_topk,
    rrf_fuse,
    shard_gpu,
    topk_dense_scores,
)
from llds_retriever.encoders import EncoderSpec
from llds_retriever.index import shard_bounds


class FakeEncoder:
    """Maps each query to a fixed vector (unit tests only)."""

    def __init__(self, vecs: dict[str, np.ndarray]):
        self.vecs = vecs
        self.dim = next(iter(vecs.values())).shape[0]
        self.max_length = 8
        self.spec = EncoderSpec("fake", "fake", "mean", "", "", True)

    def encode_queries(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        return np.stack([self.vecs[t] for t in texts]).astype(np.float32), [len(t) > 8 for t in texts]

    def encode_passages(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        raise NotImplementedError


def test_merge_topk_by_score_with_padding() -> None:
    s1 = np.array([[0.9, 0.5, 0.1]], dtype=np.float32)
    r1 = np.array([[0, 1, 2]])
    s2 = np.array([[0.7, 0.6, -3.4e38]], dtype=np.float32)
    r2 = np.array([[10, 11, -1]])  # -1: the shard had fewer than k rows
    scores, rows = merge_topk([s1, s2], [r1, r2], 4)
    assert rows.tolist() == [[0, 10, 11, 1]]
    np.testing.assert_allclose(scores, [[0.9, 0.7, 0.6, 0.5]])
    scores, rows = merge_topk([s2], [r2], 4)
    assert rows.tolist() == [[10, 11, -1, -1]]
    assert np.isneginf(scores[0, 2:]).all()


def test_merge_breaks_ties_by_lower_row() -> None:
    _, rows = merge_topk(
        [np.array([[1.0, 1.0]]), np.array([[1.0]])], [np.array([[7, 3]]), np.array([[5]])], 3
    )
    assert rows.tolist() == [[3, 5, 7]]


def test_topk_dense_scores() -> None:
    s, r = topk_dense_scores(np.array([0.1, 3.0, 2.0, 3.0, 0.0], dtype=np.float32), 3)
    assert r.tolist() == [1, 3, 2]
    assert s.tolist() == [3.0, 3.0, 2.0]
    s, r = topk_dense_scores(np.array([1.0, 2.0], dtype=np.float32), 5)
    assert r.tolist() == [1, 0]


def test_rrf_fuse_hand_computed() -> None:
    a = Hits(np.zeros((1, 3), np.float32), np.array([[1, 2, 3]]), [False])
    b = Hits(np.zeros((1, 3), np.float32), np.array([[3, 1, -1]]), [False])
    scores, rows = rrf_fuse([a, b], [1.0, 0.5], rrf_k=10, k=3)
    # row 1: 1/11 + 0.5/12 ; row 3: 1/13 + 0.5/11 ; row 2: 1/12
    expect = {1: 1 / 11 + 0.5 / 12, 3: 1 / 13 + 0.5 / 11, 2: 1 / 12}
    order = sorted(expect, key=lambda r: -expect[r])
    assert rows.tolist() == [order]
    np.testing.assert_allclose(scores[0], [expect[r] for r in order], rtol=1e-6)


def test_shard_bounds_and_gpu_placement() -> None:
    assert shard_bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert shard_bounds(5, 1) == [(0, 5)]
    assert [shard_gpu(i, 2) for i in range(5)] == [0, 1, 0, 1, 0]
    with pytest.raises(ValueError):
        shard_gpu(0, 0)


def test_two_shards_give_the_same_topk_as_one_index() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((101, 16)).astype(np.float32)
    queries = {f"q{i}": rng.standard_normal(16).astype(np.float32) for i in range(20)}
    enc = FakeEncoder(queries)
    full = faiss.IndexFlatIP(16)
    full.add(x)
    shards = []
    bounds = shard_bounds(101, 2)
    for lo, hi in bounds:
        s = faiss.IndexFlatIP(16)
        s.add(x[lo:hi])
        shards.append(s)
    one = DenseBackend(enc, [full]).search(list(queries), 7)
    two = DenseBackend(enc, shards, offsets=[lo for lo, _ in bounds]).search(list(queries), 7)
    assert (one.rows == two.rows).all()
    np.testing.assert_allclose(one.scores, two.scores, rtol=1e-6)
    assert one.truncated == [False] * 20


def test_bm25_ranks_and_drops_non_matching(hybrid_index: Path) -> None:
    bm25 = BM25Backend(hybrid_index / "bm25")
    hits = bm25.search(["capital of Germany", "the of and", "zzzunknown"], 3)
    assert hits.rows[0, 0] == 1  # Berlin
    assert (hits.scores[0, :-1] >= hits.scores[0, 1:]).all()
    assert (hits.rows[1] == -1).all()  # only stopwords: no hit rather than arbitrary rows
    assert (hits.rows[2] == -1).all()


def test_cuda_requested_without_gpu_is_an_error() -> None:
    from llds_retriever.config import DenseBackendConfig
    from llds_retriever.errors import IndexFormatError
    from llds_retriever.loader import _use_gpu

    if faiss.get_num_gpus() > 0:
        pytest.skip("a GPU is present")
    assert _use_gpu(DenseBackendConfig(device="auto")) is False
    with pytest.raises(IndexFormatError, match="no GPU"):
        _use_gpu(DenseBackendConfig(device="cuda"))
