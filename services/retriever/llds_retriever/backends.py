"""Search backends behind one interface: BM25 (bm25s), dense (FAISS, sharded, GPU when present), hybrid.

Every backend maps a batch of query strings to corpus row numbers and scores, best first. Rows are
line numbers of the corpus JSONL; the service turns them into documents.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from llds_retriever.encoders import Encoder
from llds_retriever.errors import IndexFormatError

log = logging.getLogger("llds.retriever")

BM25_STOPWORDS = "en"
"""Stopword list used for both corpus and query tokenisation (they must agree)."""


@dataclass
class Hits:
    """Ranked results of a batch of queries; fewer than k hits are padded with row -1."""

    scores: np.ndarray
    """[Q, k] float32, best first; -inf on padding."""
    rows: np.ndarray
    """[Q, k] int64 corpus rows; -1 on padding."""
    truncated: list[bool]
    """[Q] whether the encoder cut the query (always false for BM25)."""


class Backend(Protocol):
    """A searchable index over ``size`` corpus rows."""

    kind: str
    size: int

    def search(self, queries: list[str], k: int) -> Hits:
        """Top-``k`` rows for each query, best first."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for ``/health`` and ``llds index info``."""
        ...


def merge_topk(scores: list[np.ndarray], rows: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top-k lists into one, by score (ties: lower row first).

    Args:
        scores: S arrays [Q, k_s] float32 (padding -inf or any value where the row is -1).
        rows: S arrays [Q, k_s] int64 of global row numbers; -1 marks padding.
        k: results to keep.

    Returns:
        ([Q, k] float32 scores, [Q, k] int64 rows), padded with (-inf, -1).
    """
    s = np.concatenate(scores, axis=1).astype(np.float32)  # [Q, sum k_s]
    r = np.concatenate(rows, axis=1).astype(np.int64)  # [Q, sum k_s]
    s = np.where(r < 0, -np.inf, s).astype(np.float32)
    order = np.lexsort((np.where(r < 0, np.iinfo(np.int64).max, r), -s), axis=-1)[:, :k]  # [Q, k]
    out_s = np.take_along_axis(s, order, axis=1)
    out_r = np.take_along_axis(r, order, axis=1)
    if out_s.shape[1] < k:
        pad = k - out_s.shape[1]
        out_s = np.pad(out_s, ((0, 0), (0, pad)), constant_values=-np.inf)
        out_r = np.pad(out_r, ((0, 0), (0, pad)), constant_values=-1)
    return out_s, out_r


def topk_dense_scores(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` of one score vector [N], best first, ties by lower row: ([k'], [k']) with k' <= k."""
    k = min(k, scores.shape[0])
    part = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(scores.shape[0])
    order = np.lexsort((part, -scores[part]))
    rows = part[order]
    return scores[rows].astype(np.float32), rows.astype(np.int64)


class BM25Backend:
    """Okapi BM25 with ``bm25s``; the index arrays are memory-mapped."""

    kind = "bm25"

    def __init__(self, index_dir: Path, mmap: bool = True):
        import bm25s

        if not (index_dir / "params.index.json").exists():
            raise IndexFormatError(f"{index_dir} holds no bm25s index (params.index.json missing)")
        self._bm25s = bm25s
        self.model = bm25s.BM25.load(str(index_dir), mmap=mmap, show_progress=False)
        self.size = int(self.model.scores["num_docs"])

    def query_ids(self, query: str) -> list[int]:
        """Vocabulary ids of a query's tokens; unknown tokens and stopwords dropped."""
        tokens = self._bm25s.tokenize(
            [query], stopwords=BM25_STOPWORDS, return_ids=False, show_progress=False
        )
        return self.model.get_tokens_ids(tokens[0])

    def search(self, queries: list[str], k: int) -> Hits:
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i, q in enumerate(queries):
            ids = self.query_ids(q)
            if not ids:
                continue
            s, r = topk_dense_scores(self.model.get_scores_from_ids(ids), k)
            # A zero score means no query term occurs in the passage: not a hit.
            keep = s > 0
            n = int(keep.sum())
            scores[i, :n], rows[i, :n] = s[keep], r[keep]
        return Hits(scores, rows, [False] * len(queries))

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_docs": self.size, "vocab": len(self.model.vocab_dict)}


def _set_search_params(index: Any, ef_search: int, nprobe: int) -> None:
    import faiss

    base = faiss.downcast_index(index)
    if hasattr(base, "hnsw"):
        base.hnsw.efSearch = ef_search
    try:
        faiss.extract_index_ivf(index).nprobe = nprobe
    except RuntimeError:
        pass  # not an IVF index: nothing to set


MEMORY_MAPPED = "memory-mapped"
IN_RAM = "in RAM"


def read_faiss(path: Path, mmap: bool) -> Any:
    """Read a FAISS index file, memory-mapped when asked, else into RAM.

    Mapping uses ``IO_FLAG_MMAP_IFC``, which maps the file and reads flat, HNSW and IVF indexes from
    it in place (checked for each in the tests). ``IO_FLAG_MMAP`` alone maps only IVF inverted
    lists: a flat index, such as Search-R1's 61 GiB wiki-18 one, would be read whole into RAM.
    """
    import faiss

    if not path.is_file():
        raise IndexFormatError(f"FAISS index file {path} does not exist")
    try:
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC if mmap else 0)
    except RuntimeError as e:
        raise IndexFormatError(f"cannot read FAISS index {path}: {e}") from e


def storage_of(path: Path) -> str:
    """Where this process holds ``path``'s index: ``memory-mapped`` if the kernel lists a mapping of
    the file in ``/proc/self/maps`` (by path or by device and inode), else ``in RAM``."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return "unknown (no /proc/self/maps to check)"
    st = path.stat()
    real = os.path.realpath(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        if fields[5] == real or (fields[4] == str(st.st_ino) and fields[3] == dev):
            return MEMORY_MAPPED
    return IN_RAM


def place_on_gpus(indexes: list[Any], fp16: bool, shard: bool) -> list[Any]:
    """Move FAISS indexes to the GPUs: one index split (or replicated) over all; shard i on GPU i % n.

    Only called when ``faiss.get_num_gpus() > 0`` (faiss-gpu installed and a device present).
    """
    import faiss

    ngpu = faiss.get_num_gpus()
    if len(indexes) == 1:
        co = faiss.GpuMultipleClonerOptions()
        co.useFloat16 = fp16
        co.shard = shard
        return [faiss.index_cpu_to_all_gpus(indexes[0], co=co, ngpu=ngpu)]
    placed = []
    for i, index in enumerate(indexes):
        res = faiss.StandardGpuResources()
        co1 = faiss.GpuClonerOptions()
        co1.useFloat16 = fp16
        gpu_index = faiss.index_cpu_to_gpu(res, shard_gpu(i, ngpu), index, co1)
        gpu_index.referenced_resources = res  # type: ignore[attr-defined]  # keeps the resources alive
        placed.append(gpu_index)
    return placed


def shard_gpu(shard: int, ngpu: int) -> int:
    """GPU that holds shard ``shard`` (round robin)."""
    if ngpu < 1:
        raise ValueError("no GPU to place a shard on")
    return shard % ngpu


class DenseBackend:
    """Inner-product FAISS search over one or more shards, each a contiguous slice of the corpus."""

    kind = "dense"

    def __init__(
        self,
        encoder: Encoder,
        shards: list[Any],
        offsets: list[int] | None = None,
        use_gpu: bool = False,
        fp16: bool = True,
        gpu_shard: bool = True,
        ef_search: int = 128,
        nprobe: int = 32,
        index_type: str = "flat",
        storage: str = IN_RAM,
    ):
        if not shards:
            raise IndexFormatError("dense backend needs at least one FAISS index")
        for s in shards:
            if s.d != encoder.dim:
                raise IndexFormatError(
                    f"index dimension {s.d} != encoder {encoder.spec.name} dimension {encoder.dim}"
                )
            _set_search_params(s, ef_search, nprobe)
        sizes = [int(s.ntotal) for s in shards]
        self.offsets = offsets if offsets is not None else [int(x) for x in np.cumsum([0, *sizes[:-1]])]
        self.encoder = encoder
        self.index_type = index_type
        self.storage = "GPU" if use_gpu else storage
        """Where the vectors are searched from: memory-mapped, in RAM, or GPU (for /health)."""
        self.shards = place_on_gpus(shards, fp16, gpu_shard) if use_gpu else shards
        self.size = sum(sizes)
        self.use_gpu = use_gpu
        self._pool = ThreadPoolExecutor(len(shards), thread_name_prefix="shard") if len(shards) > 1 else None

    def search_vectors(self, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores [Q, k], rows [Q, k]) for query vectors [Q, D], merged over shards."""
        if self._pool is None:
            s, r = self.shards[0].search(vecs, k)
            return merge_topk([s], [r], k)
        # FAISS releases the GIL, so shards (on several GPUs, or CPU cores) search concurrently.
        outs = list(self._pool.map(lambda sh: sh.search(vecs, k), self.shards))
        rows = [np.where(r < 0, -1, r + off) for (_, r), off in zip(outs, self.offsets, strict=True)]
        return merge_topk([s for s, _ in outs], rows, k)

    def search(self, queries: list[str], k: int) -> Hits:
        vecs, truncated = self.encoder.encode_queries(queries)
        scores, rows = self.search_vectors(vecs, k)
        return Hits(scores, rows, truncated)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "num_docs": self.size,
            "shards": len(self.shards),
            "index_type": self.index_type,
            "encoder": self.encoder.spec.name,
            "dim": self.encoder.dim,
            "gpu": self.use_gpu,
            "storage": self.storage,
        }


def rrf_fuse(runs: list[Hits], weights: list[float], rrf_k: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion: row score = sum over runs of weight / (rrf_k + rank), rank from 1.

    Returns ([Q, k] float32 fused scores, [Q, k] int64 rows), best first, ties by lower row.
    """
    nq = runs[0].rows.shape[0]
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_r = np.full((nq, k), -1, dtype=np.int64)
    for q in range(nq):
        fused: dict[int, float] = {}
        for run, w in zip(runs, weights, strict=True):
            for rank, row in enumerate(run.rows[q].tolist(), start=1):
                if row >= 0:
                    fused[row] = fused.get(row, 0.0) + w / (rrf_k + rank)
        best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        for j, (row, score) in enumerate(best):
            out_s[q, j], out_r[q, j] = score, row
    return out_s, out_r


class HybridBackend:
    """Dense and BM25 rankings fused by weighted reciprocal rank fusion."""

    kind = "hybrid"

    def __init__(
        self,
        dense: DenseBackend,
        bm25: BM25Backend,
        dense_weight: float = 1.0,
        bm25_weight: float = 1.0,
        rrf_k: int = 60,
        depth: int = 50,
    ):
        if dense.size != bm25.size:
            raise IndexFormatError(f"dense index has {dense.size} rows but BM25 index has {bm25.size}")
        self.dense, self.bm25 = dense, bm25
        self.weights = [dense_weight, bm25_weight]
        self.rrf_k, self.depth = rrf_k, depth
        self.size = dense.size

    def search(self, queries: list[str], k: int) -> Hits:
        depth = min(max(k, self.depth), self.size)
        d = self.dense.search(queries, depth)
        b = self.bm25.search(queries, depth)
        scores, rows = rrf_fuse([d, b], self.weights, self.rrf_k, k)
        return Hits(scores, rows, d.truncated)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "num_docs": self.size,
            "weights": {"dense": self.weights[0], "bm25": self.weights[1]},
            "rrf_k": self.rrf_k,
            "dense": self.dense.describe(),
            "bm25": self.bm25.describe(),
        }
