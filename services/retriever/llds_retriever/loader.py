"""Turn a ``RetrieverConfig`` into a ready backend and its corpus (the slow part of start-up)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds_retriever.backends import (
    IN_RAM,
    MEMORY_MAPPED,
    Backend,
    BM25Backend,
    DenseBackend,
    HybridBackend,
    read_faiss,
    storage_of,
)
from llds_retriever.config import AutoBackendConfig, DenseBackendConfig, RetrieverConfig
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


def _use_gpu(section: DenseBackendConfig) -> bool:
    import faiss

    ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if section.device == "cuda" and ngpu == 0:
        raise IndexFormatError("device=cuda but FAISS sees no GPU (install faiss-gpu)")
    return section.device != "cpu" and ngpu > 0


def _encoder(section: DenseBackendConfig, dense_meta: dict[str, Any]) -> Any:
    name = section.encoder or dense_meta["encoder"]
    same = section.encoder is None or section.encoder == dense_meta.get("encoder")
    return load_encoder(
        name,
        pooling=section.pooling or (dense_meta.get("pooling") if same else None),
        query_prefix=section.query_prefix
        if section.query_prefix is not None
        else (dense_meta.get("query_prefix") if same else None),
        max_length=section.query_max_length,
        device=section.device,
        fp16=section.fp16,
        torch_threads=section.torch_threads,
        jit=section.jit,
    )


def _faiss(section: DenseBackendConfig, encoder: Any, shards: list[Any], **kwargs: Any) -> DenseBackend:
    return DenseBackend(
        encoder,
        shards,
        use_gpu=_use_gpu(section),
        fp16=section.fp16,
        gpu_shard=section.gpu_shard,
        ef_search=section.hnsw_ef_search,
        nprobe=section.ivf_nprobe,
        **kwargs,
    )


def _read(path: Path, mmap: bool) -> tuple[Any, str]:
    """A FAISS file read as ``mmap`` asks, and where it ended up: a mapping is checked in
    ``/proc/self/maps`` rather than assumed; a file read without one is in RAM."""
    index = read_faiss(path, mmap)
    storage = storage_of(path) if mmap else IN_RAM
    log.info("event=faiss_loaded file=%s vectors=%d bytes=%d storage=%r", path, index.ntotal,
             path.stat().st_size, storage)  # fmt: skip
    if mmap and storage != MEMORY_MAPPED:
        log.warning("event=faiss_not_mapped file=%s storage=%r (mmap = true was asked)", path, storage)
    return index, storage


def _storage(storages: list[str]) -> str:
    return ", ".join(sorted(set(storages)))


def _dense(section: DenseBackendConfig, index_dir: Path, meta: dict[str, Any], mmap: bool) -> DenseBackend:
    shards, storages = zip(*(_read(index_dir / s["file"], mmap) for s in meta["shards"]), strict=True)
    for s, info in zip(shards, meta["shards"], strict=True):
        if s.ntotal != info["rows"]:
            raise IndexFormatError(f"{info['file']} holds {s.ntotal} vectors, manifest says {info['rows']}")
    offsets = [s["offset"] for s in meta["shards"]]
    return _faiss(section, _encoder(section, meta), list(shards), offsets=offsets, index_type=meta["index_type"],
                  storage=_storage(list(storages)))  # fmt: skip


def _bm25_backend(section: Any, index_dir: Path, manifest: dict[str, Any], mmap: bool) -> Backend:
    return BM25Backend(index_dir / manifest["bm25"]["dir"], mmap=mmap)


def _dense_backend(section: Any, index_dir: Path, manifest: dict[str, Any], mmap: bool) -> Backend:
    return _dense(section, index_dir, manifest["dense"], mmap)


def _hybrid_backend(section: Any, index_dir: Path, manifest: dict[str, Any], mmap: bool) -> Backend:
    return HybridBackend(
        _dense(section, index_dir, manifest["dense"], mmap),
        BM25Backend(index_dir / manifest["bm25"]["dir"], mmap=mmap),
        dense_weight=section.dense_weight,
        bm25_weight=section.bm25_weight,
        rrf_k=section.rrf_k,
        depth=section.depth,
    )


_BACKENDS: dict[str, tuple[Callable[[Any, Path, dict[str, Any], bool], Backend], list[str]]] = {
    "bm25": (_bm25_backend, ["bm25"]),
    "dense": (_dense_backend, ["dense"]),
    "hybrid": (_hybrid_backend, ["bm25", "dense"]),
}
"""``backend.type`` -> (its factory, the manifest parts it needs)."""


def backend_section(config: RetrieverConfig, kind: str) -> Any:
    """The ``[backend]`` section for an index of ``kind``: ``auto`` resolved to it, else as given."""
    section = config.backend
    return section.resolve(kind) if isinstance(section, AutoBackendConfig) else section


def load(config: RetrieverConfig) -> Loaded:
    """Load what ``config`` names: an index folder, or a bare FAISS file plus its corpus."""
    config.require_source()
    if config.faiss_index is not None:
        assert config.corpus is not None  # enforced by RetrieverConfig
        corpus = CorpusStore(config.corpus)
        index, storage = _read(config.faiss_index, config.mmap)
        if index.ntotal != len(corpus):
            raise CorpusError(
                f"{config.faiss_index} holds {index.ntotal} vectors but {config.corpus} has {len(corpus)} rows"
            )
        section = backend_section(config, "dense")
        meta = {"encoder": section.encoder or SEARCH_R1_ENCODER}
        backend: Backend = _faiss(section, _encoder(section, meta), [index], storage=storage)
        return Loaded(backend, corpus, {"faiss_index": str(config.faiss_index), "corpus": str(config.corpus)})

    assert config.index_dir is not None
    index_dir = config.index_dir
    manifest = read_manifest(index_dir)
    section = backend_section(config, manifest["kind"])
    kind = section.type
    factory, parts = _BACKENDS[kind]
    for part in parts:
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
    backend = factory(section, index_dir, manifest, config.mmap)
    if backend.size != len(corpus):
        raise IndexFormatError(f"backend has {backend.size} rows, corpus {len(corpus)}")
    return Loaded(backend, corpus, {"index_dir": str(index_dir), "kind": kind})
