"""Turn a ``RetrieverConfig`` into a ready backend and its corpus (the slow part of start-up)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds_retriever.backends import Backend, BM25Backend, DenseBackend, HybridBackend, read_faiss
from llds_retriever.config import RetrieverConfig
from llds_retriever.corpus import CorpusStore
from llds_retriever.encoders import load_encoder
from llds_retriever.errors import CorpusError, IndexFormatError
from llds_retriever.index import open_corpus, read_manifest

log = logging.getLogger("llds.retriever")

SEARCH_R1_ENCODER = "intfloat/e5-base-v2"
"""The encoder Search-R1's released ``e5_Flat.index`` was built with."""


@dataclass
class Loaded:
    """What the service serves from."""

    backend: Backend
    corpus: CorpusStore
    source: dict[str, Any]


def _use_gpu(config: RetrieverConfig) -> bool:
    import faiss

    ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if config.device == "cuda" and ngpu == 0:
        raise IndexFormatError("device=cuda but FAISS sees no GPU (install faiss-gpu)")
    return config.device != "cpu" and ngpu > 0


def _encoder(config: RetrieverConfig, dense_meta: dict[str, Any]) -> Any:
    name = config.encoder or dense_meta["encoder"]
    same = config.encoder is None or config.encoder == dense_meta.get("encoder")
    return load_encoder(
        name,
        pooling=config.pooling or (dense_meta.get("pooling") if same else None),
        query_prefix=config.query_prefix
        if config.query_prefix is not None
        else (dense_meta.get("query_prefix") if same else None),
        max_length=config.query_max_length,
        device=config.device,
        fp16=config.fp16,
        torch_threads=config.torch_threads,
        jit=config.jit,
    )


def _dense(config: RetrieverConfig, index_dir: Path, meta: dict[str, Any]) -> DenseBackend:
    shards = [read_faiss(index_dir / s["file"], config.mmap) for s in meta["shards"]]
    for s, info in zip(shards, meta["shards"], strict=True):
        if s.ntotal != info["rows"]:
            raise IndexFormatError(f"{info['file']} holds {s.ntotal} vectors, manifest says {info['rows']}")
    return DenseBackend(
        _encoder(config, meta),
        shards,
        offsets=[s["offset"] for s in meta["shards"]],
        use_gpu=_use_gpu(config),
        fp16=config.fp16,
        gpu_shard=config.gpu_shard,
        ef_search=config.hnsw_ef_search,
        nprobe=config.ivf_nprobe,
        index_type=meta["index_type"],
    )


def _bm25_backend(config: RetrieverConfig, index_dir: Path, manifest: dict[str, Any]) -> Backend:
    return BM25Backend(index_dir / manifest["bm25"]["dir"], mmap=config.mmap)


def _dense_backend(config: RetrieverConfig, index_dir: Path, manifest: dict[str, Any]) -> Backend:
    return _dense(config, index_dir, manifest["dense"])


def _hybrid_backend(config: RetrieverConfig, index_dir: Path, manifest: dict[str, Any]) -> Backend:
    return HybridBackend(
        _dense(config, index_dir, manifest["dense"]),
        BM25Backend(index_dir / manifest["bm25"]["dir"], mmap=config.mmap),
        dense_weight=config.hybrid_dense_weight,
        bm25_weight=config.hybrid_bm25_weight,
        rrf_k=config.rrf_k,
        depth=config.hybrid_depth,
    )


_BACKENDS: dict[str, Callable[[RetrieverConfig, Path, dict[str, Any]], Backend]] = {
    "bm25": _bm25_backend,
    "dense": _dense_backend,
    "hybrid": _hybrid_backend,
}
"""Backend factory per ``type``."""

_PARTS = {"bm25": ["bm25"], "dense": ["dense"], "hybrid": ["bm25", "dense"]}
"""Manifest sections each ``type`` needs."""


def load(config: RetrieverConfig) -> Loaded:
    """Load what ``config`` names: an index folder, or a bare FAISS file plus its corpus."""
    config.require_source()
    if config.faiss_index is not None:
        assert config.corpus is not None  # enforced by RetrieverConfig
        corpus = CorpusStore(config.corpus)
        index = read_faiss(config.faiss_index, config.mmap)
        if index.ntotal != len(corpus):
            raise CorpusError(
                f"{config.faiss_index} holds {index.ntotal} vectors but {config.corpus} has {len(corpus)} rows"
            )
        meta = {"encoder": config.encoder or SEARCH_R1_ENCODER}
        backend: Backend = DenseBackend(
            _encoder(config, meta),
            [index],
            use_gpu=_use_gpu(config),
            fp16=config.fp16,
            gpu_shard=config.gpu_shard,
            ef_search=config.hnsw_ef_search,
            nprobe=config.ivf_nprobe,
        )
        return Loaded(backend, corpus, {"faiss_index": str(config.faiss_index), "corpus": str(config.corpus)})

    assert config.index_dir is not None
    index_dir = config.index_dir
    manifest = read_manifest(index_dir)
    kind = config.type or manifest["kind"]
    for part in _PARTS[kind]:
        if part not in manifest:
            raise IndexFormatError(
                f"{index_dir} was built as {manifest['kind']}; it cannot serve type={kind}"
            )
    if config.corpus is None:
        corpus = open_corpus(index_dir, manifest)
    else:
        corpus = CorpusStore(config.corpus)
        if len(corpus) != manifest["num_docs"]:
            raise CorpusError(f"{config.corpus} has {len(corpus)} rows; the index has {manifest['num_docs']}")
    backend = _BACKENDS[kind](config, index_dir, manifest)
    if backend.size != len(corpus):
        raise IndexFormatError(f"backend has {backend.size} rows, corpus {len(corpus)}")
    return Loaded(backend, corpus, {"index_dir": str(index_dir), "kind": kind})
