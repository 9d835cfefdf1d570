"""Index folders: build, resume, info, every index type, sharding, and Search-R1's bare FAISS files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest

from llds_retriever.cli import index_main
from llds_retriever.config import RetrieverConfig
from llds_retriever.errors import CorpusError, IndexFormatError
from llds_retriever.index import BuildOptions, build_index, read_manifest
from llds_retriever.loader import load

QUERIES = ["what is the capital of France", "largest planet", "who wrote Hamlet", "genetic instructions"]


def _ids(cfg: RetrieverConfig, queries: list[str], k: int = 3) -> list[list[str]]:
    loaded = load(cfg)
    hits = loaded.backend.search(queries, k)
    return [[loaded.corpus.doc(r)["id"] for r in row if r >= 0] for row in hits.rows.tolist()]


def test_hybrid_index_layout_and_info(hybrid_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = read_manifest(hybrid_index)
    assert m["kind"] == "hybrid" and m["num_docs"] == 12
    assert [s["rows"] for s in m["dense"]["shards"]] == [6, 6]
    assert sorted(p.name for p in (hybrid_index / "embeddings").glob("chunk_*.npy")) == [
        "chunk_000000.npy",
        "chunk_000001.npy",
        "chunk_000002.npy",
    ]
    assert index_main(["info", str(hybrid_index)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "hybrid" and info["disk_bytes"] > 0


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_every_backend_finds_the_obvious_passage(hybrid_index: Path, kind: str) -> None:
    backend = {"type": kind} | ({} if kind == "bm25" else {"device": "cpu"})
    got = _ids(RetrieverConfig(index_dir=hybrid_index, backend=backend), QUERIES)
    assert [g[0] for g in got] == ["d0", "d5", "d11", "d10"]


def test_two_shards_equal_one_index(hybrid_index: Path, corpus_file: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    build_index(BuildOptions(corpus=corpus_file, kind="dense", out=one, device="cpu", progress=False))
    cfg1 = RetrieverConfig(index_dir=one, backend={"device": "cpu"})
    cfg2 = RetrieverConfig(index_dir=hybrid_index, backend={"type": "dense", "device": "cpu"})
    l1, l2 = load(cfg1), load(cfg2)
    h1, h2 = l1.backend.search(QUERIES, 12), l2.backend.search(QUERIES, 12)
    assert (h1.rows == h2.rows).all()
    np.testing.assert_allclose(h1.scores, h2.scores, atol=1e-5)


def test_resume_reencodes_only_missing_chunks(hybrid_index: Path, corpus_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "resume"
    opts = BuildOptions(corpus=corpus_file, kind="dense", out=out, chunk_size=5, device="cpu", progress=False)
    build_index(opts)
    chunks = sorted((out / "embeddings").glob("chunk_*.npy"))
    before = {p.name: (p.stat().st_mtime_ns, np.load(p)) for p in chunks}
    os.remove(chunks[1])
    (out / "manifest.json").unlink()  # as if the build had been interrupted
    with pytest.raises(IndexFormatError, match=r"no manifest\.json"):
        load(RetrieverConfig(index_dir=out, backend={"device": "cpu"}))
    build_index(opts)
    for p in sorted((out / "embeddings").glob("chunk_*.npy")):
        mtime, arr = before[p.name]
        if p.name != chunks[1].name:
            assert p.stat().st_mtime_ns == mtime  # not re-encoded
        np.testing.assert_allclose(np.load(p), arr, atol=1e-5)
    with pytest.raises(IndexFormatError, match="different settings"):
        build_index(BuildOptions(**{**opts.__dict__, "chunk_size": 4}))


@pytest.mark.parametrize("index_type", ["hnsw", "ivfpq"])
def test_approximate_index_types(tmp_path: Path, index_type: str, corpus_writer: Any) -> None:
    corpus = corpus_writer(tmp_path / "c.jsonl", n_extra=150)
    out = tmp_path / index_type
    argv = ["build", "--corpus", str(corpus), "--kind", "dense", "--out", str(out)]
    argv += ["--index-type", index_type, "--device", "cpu", "--no-progress", "--batch-size", "128"]
    assert index_main(argv) == 0
    assert read_manifest(out)["dense"]["index_type"] == index_type
    got = _ids(RetrieverConfig(index_dir=out, backend={"device": "cpu", "ivf_nprobe": 64}), QUERIES, k=5)
    # Approximate search: the obvious passage is still in the top 5.
    for want, row in zip(["d0", "d5", "d11", "d10"], got, strict=True):
        assert want in row


def test_bare_faiss_index_and_corpus_like_search_r1(
    hybrid_index: Path, corpus_file: Path, tmp_path: Path
) -> None:
    vecs = np.concatenate([np.load(p) for p in sorted((hybrid_index / "embeddings").glob("chunk_*.npy"))])
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    path = tmp_path / "e5_Flat.index"
    faiss.write_index(flat, str(path))
    cfg = RetrieverConfig(
        faiss_index=path, corpus=corpus_file, backend={"encoder": "minilm", "device": "cpu"}
    )
    assert [g[0] for g in _ids(cfg, QUERIES)] == ["d0", "d5", "d11", "d10"]
    short = tmp_path / "short.jsonl"
    short.write_text("".join(corpus_file.read_text().splitlines(keepends=True)[:5]))
    with pytest.raises(CorpusError, match="12 vectors"):
        load(RetrieverConfig(faiss_index=path, corpus=short, backend={"encoder": "minilm", "device": "cpu"}))


def test_build_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "a"}\n{"id": "1", "contents": "b"}\n')
    assert index_main(["build", "--corpus", str(bad), "--kind", "bm25", "--out", str(tmp_path / "o")]) == 2
    assert "duplicate id '1'" in capsys.readouterr().err
    assert (
        index_main(
            [
                "build",
                "--corpus",
                str(tmp_path / "nope.jsonl"),
                "--kind",
                "bm25",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    assert index_main(["info", str(tmp_path / "o")]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_wrong_type_for_index(hybrid_index: Path, tmp_path: Path, corpus_file: Path) -> None:
    out = tmp_path / "bm25only"
    build_index(BuildOptions(corpus=corpus_file, kind="bm25", out=out, progress=False))
    with pytest.raises(IndexFormatError, match="cannot serve type=dense"):
        load(RetrieverConfig(index_dir=out, backend="dense"))


def test_corpus_override_at_serve_time(hybrid_index: Path, corpus_file: Path, tmp_path: Path) -> None:
    cfg = RetrieverConfig(index_dir=hybrid_index, backend="bm25", corpus=corpus_file)
    assert [g[0] for g in _ids(cfg, QUERIES)] == ["d0", "d5", "d11", "d10"]
    short = tmp_path / "short.jsonl"
    short.write_text("".join(corpus_file.read_text().splitlines(keepends=True)[:3]))
    with pytest.raises(CorpusError, match="has 3 rows"):
        load(RetrieverConfig(index_dir=hybrid_index, backend="bm25", corpus=short))
