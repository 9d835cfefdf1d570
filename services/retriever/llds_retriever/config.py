"""``RetrieverConfig``: every knob of the retriever server, with defaults that serve on 2 CPU cores.

Precedence (see :mod:`llds_server.settings`): defaults < TOML file < ``LLDS_RETRIEVER_*`` env < CLI flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from llds_proto.messages import MAX_TOPK
from llds_server.settings import ConfigModel, ServiceSettings, refuse_moved, typed_union

Pooling = Literal["mean", "cls"]


class BM25BackendConfig(ConfigModel):
    """Sparse BM25 over the index's ``bm25`` part."""

    type: Literal["bm25"] = "bm25"
    """Backend: auto (whatever the index folder holds), bm25, dense or hybrid."""


class DenseBackendConfig(ConfigModel):
    """A query encoder and FAISS over the index's ``dense`` part (or a bare ``faiss_index``)."""

    type: Literal["dense"] = "dense"
    """Backend: auto (whatever the index folder holds), bm25, dense or hybrid."""
    encoder: str | None = None
    """Query encoder (HF name or local path); unset = the encoder the index was built with."""
    pooling: Pooling | None = None
    """Override the encoder's pooling; unset = the encoder family's (e5/MiniLM mean, bge cls)."""
    query_prefix: str | None = None
    """Override the text put before each query (e5 uses ``query: ``)."""
    query_max_length: int = Field(default=256, ge=8, le=8192)
    """Longest query in encoder tokens; longer queries are cut and flagged ``truncated``."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the encoder and FAISS run; auto = CUDA when present."""
    fp16: bool = True
    """On CUDA: encoder in half precision and FAISS GPU indexes with fp16 storage."""
    gpu_shard: bool = True
    """On several GPUs: split the FAISS index across all of them (else replicate)."""
    jit: bool = True
    """Run the query encoder as a TorchScript trace: one GIL release per forward instead of per op."""
    torch_threads: int = Field(default=0, ge=0)
    """CPU threads for the encoder; 0 = torch's default."""
    hnsw_ef_search: int = Field(default=128, ge=1)
    """HNSW search breadth; higher = better recall, slower."""
    ivf_nprobe: int = Field(default=32, ge=1)
    """IVF lists probed per query; higher = better recall, slower."""


class HybridBackendConfig(DenseBackendConfig):
    """BM25 and dense rankings fused by reciprocal rank."""

    type: Literal["hybrid"] = "hybrid"  # type: ignore[assignment]
    """Backend: auto (whatever the index folder holds), bm25, dense or hybrid."""
    dense_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the dense ranking in reciprocal rank fusion."""
    bm25_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the BM25 ranking in reciprocal rank fusion."""
    rrf_k: int = Field(default=60, ge=1)
    """RRF constant: a document at rank r (1-based) scores weight / (rrf_k + r)."""
    depth: int = Field(default=50, ge=1, le=1000)
    """Candidates each backend contributes to the fusion (at least topk)."""


class AutoBackendConfig(HybridBackendConfig):
    """Whatever the index folder was built as (its manifest's ``kind``), a bare ``faiss_index`` dense;
    it takes the knobs of any backend, since it may become any."""

    type: Literal["auto"] = "auto"  # type: ignore[assignment]
    """Backend: auto (whatever the index folder holds), bm25, dense or hybrid."""

    def resolve(self, kind: str) -> BackendConfig:
        """The concrete backend of an index built as ``kind``, with this section's knobs for it."""
        chosen: type[ConfigModel] = VARIANTS[kind]
        return chosen.model_validate(self.model_dump(include=set(chosen.model_fields) - {"type"}))


VARIANTS: dict[str, type[ConfigModel]] = {
    "bm25": BM25BackendConfig,
    "dense": DenseBackendConfig,
    "hybrid": HybridBackendConfig,
}
"""A concrete backend's ``type`` -> its section."""

BackendConfig: Any = typed_union(
    AutoBackendConfig, BM25BackendConfig, DenseBackendConfig, HybridBackendConfig
)
"""The ``[backend]`` section: one of the variants, picked by ``type`` (``auto`` when unset)."""

MOVED = {
    **{k: f"backend.{k}" for k in ("type", *DenseBackendConfig.model_fields)},
    "hybrid_dense_weight": "backend.dense_weight", "hybrid_bm25_weight": "backend.bm25_weight",
    "rrf_k": "backend.rrf_k", "hybrid_depth": "backend.depth",
}  # fmt: skip
"""Flat settings of earlier releases -> where they live now (an old TOML fails with this message)."""


class RetrieverConfig(ServiceSettings):
    """Configuration of ``llds retriever serve``."""

    model_config = SettingsConfigDict(
        env_prefix="LLDS_RETRIEVER_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    host: str = "127.0.0.1"
    """Interface to bind; loopback unless deliberately exposed."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port (0 = any free port)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the service's structured log lines."""

    index_dir: Path | None = None
    """Index folder written by ``llds index build``."""
    faiss_index: Path | None = None
    """A bare FAISS index file (e.g. Search-R1's ``e5_Flat.index``), served with ``corpus``."""
    corpus: Path | None = None
    """Corpus JSONL whose line i is the index's row i; required with ``faiss_index``."""
    backend: BackendConfig = Field(default_factory=AutoBackendConfig)
    """The search backend, picked by ``backend.type``: auto (the index's kind), bm25, dense, hybrid."""
    mmap: bool = True
    """Memory-map index files instead of reading them into RAM (FAISS flat, HNSW and IVF files and
    the BM25 arrays); ``/health`` says which it got. Needed for wiki-18 on small hosts."""

    max_topk: int = Field(default=MAX_TOPK, ge=1, le=MAX_TOPK)
    """Largest topk served; above it a request gets 422."""
    max_wait_ms: float = Field(default=1.0, ge=0.0, le=1000.0)
    """How long the first query of a batch waits for others before the batch runs."""
    max_batch: int = Field(default=32, ge=1, le=4096)
    """Most queries in one batched encode + search."""
    max_queue: int = Field(default=2048, ge=1)
    """Queries admitted but not yet answered; beyond it requests get 503 with Retry-After."""
    retry_after_s: int = Field(default=1, ge=0)
    """Retry-After seconds sent with 503 answers."""
    cache_size: int = Field(default=50_000, ge=0)
    """Entries of the (query, topk) LRU result cache; 0 disables it."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest request body accepted; larger gets 413."""
    response_extras: bool = True
    """Add ``request_id``/``truncated``/``schema_version`` after ``result``; false = Search-R1 bytes only."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return refuse_moved(data, MOVED, "these retriever settings moved into [backend]")

    @model_validator(mode="after")
    def _one_source(self) -> RetrieverConfig:
        if self.faiss_index is not None and self.corpus is None:
            raise ValueError("faiss_index needs corpus (the JSONL whose line i is row i)")
        if self.faiss_index is not None and self.index_dir is not None:
            raise ValueError("give either index_dir or faiss_index, not both")
        if self.faiss_index is not None and self.backend.type not in ("auto", "dense"):
            raise ValueError("a bare faiss_index can only serve backend.type = dense")
        return self

    def require_source(self) -> None:
        """Raise if the config names nothing to serve (checked when serving, not when benchmarking)."""
        if self.index_dir is None and self.faiss_index is None:
            raise ValueError("nothing to serve: set index_dir (--index) or faiss_index + corpus")
