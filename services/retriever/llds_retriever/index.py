"""Index folders: build (resumable, chunked), describe, and load into a backend.

Layout of an index folder (``manifest.json`` is written last; without it the folder is incomplete)::

    corpus.jsonl            the corpus, one canonical JSON row per line (row i = line i)
    corpus.offsets.npy      [n + 1] uint64 line start offsets
    bm25/                   bm25s arrays (kind bm25 or hybrid)
    embeddings/chunk_*.npy  passage vectors, chunk_size rows per file (kind dense or hybrid)
    dense.shard000.index    FAISS index per shard (row offsets in the manifest)
    manifest.json           what the folder holds

Encoding is the slow step (hours for tens of millions of passages on a GPU), so each chunk of vectors
is written atomically and a rerun of the same command skips the chunks already on disk.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llds_retriever.corpus import CorpusStore, canonical_json, iter_rows
from llds_retriever.errors import CorpusError, IndexFormatError

log = logging.getLogger("llds.retriever")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
KINDS = ("bm25", "dense", "hybrid")
INDEX_TYPES = ("flat", "hnsw", "ivfpq")


@dataclass
class BuildOptions:
    """Parameters of ``llds index build``."""

    corpus: Path
    kind: str
    out: Path
    encoder: str = "minilm"
    index_type: str = "flat"
    shards: int = 1
    chunk_size: int = 65_536
    batch_size: int = 64
    device: str = "auto"
    max_length: int = 256
    hnsw_m: int = 32
    ivf_nlist: int = 0
    ivf_m: int = 0
    progress: bool = True


def _tqdm(progress: bool, **kw: Any) -> Any:
    from tqdm import tqdm

    return tqdm(disable=not progress, **kw)


def _atomic_save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _copy_corpus(src: Path, out: Path, progress: bool) -> int:
    """Write ``out/corpus.jsonl`` (canonical rows) and its offsets; skip if done for this source."""
    if not src.is_file():
        raise CorpusError(f"corpus file {src} does not exist")
    st = src.stat()
    stamp = {"source": str(src.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    stamp_path = out / "corpus.stamp.json"
    if stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return len(np.load(out / "corpus.offsets.npy", mmap_mode="r")) - 1
    offsets = [0]
    ids: set[str] = set()
    tmp = out / ".corpus.jsonl.tmp"
    with tmp.open("wb") as f, _tqdm(progress, desc="corpus", unit="doc") as bar:
        for i, row in enumerate(iter_rows(src)):
            if row["id"] in ids:
                raise CorpusError(f"{src}:{i + 1}: duplicate id {row['id']!r}")
            ids.add(row["id"])
            line = canonical_json(row) + b"\n"
            f.write(line)
            offsets.append(offsets[-1] + len(line))
            bar.update(1)
    if len(offsets) == 1:
        raise CorpusError(f"corpus {src} is empty")
    os.replace(tmp, out / "corpus.jsonl")
    _atomic_save_npy(out / "corpus.offsets.npy", np.asarray(offsets, dtype=np.uint64))
    _write_json(stamp_path, stamp)
    return len(offsets) - 1


def _build_bm25(store: CorpusStore, out: Path, progress: bool) -> dict[str, Any]:
    import bm25s

    from llds_retriever.backends import BM25_STOPWORDS

    final = out / "bm25"
    if (final / "params.index.json").exists() and (out / "bm25.stamp").exists():
        return {"dir": "bm25", "stopwords": BM25_STOPWORDS}
    texts = [store.contents(i) for i in range(len(store))]
    tokens = bm25s.tokenize(texts, stopwords=BM25_STOPWORDS, show_progress=progress)
    model = bm25s.BM25()
    model.index(tokens, show_progress=progress)
    tmp = out / ".bm25.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(str(tmp), show_progress=False)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    (out / "bm25.stamp").write_text("ok\n")
    return {"dir": "bm25", "stopwords": BM25_STOPWORDS}


def _encode_chunks(store: CorpusStore, opts: BuildOptions) -> tuple[dict[str, Any], list[Path]]:
    """Encode the corpus into ``embeddings/chunk_*.npy``, skipping chunks already written."""
    from llds_retriever.encoders import resolve_spec

    emb_dir = opts.out / "embeddings"
    emb_dir.mkdir(exist_ok=True)
    spec = resolve_spec(opts.encoder)
    meta = {
        "encoder": opts.encoder,
        "pooling": spec.pooling,
        "query_prefix": spec.query_prefix,
        "passage_prefix": spec.passage_prefix,
        "max_length": opts.max_length,
        "chunk_size": opts.chunk_size,
        "num_docs": len(store),
    }
    meta_path = emb_dir / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old != meta:
            raise IndexFormatError(
                f"{emb_dir} holds vectors made with different settings ({old}); use a new --out "
                "or delete that folder"
            )
    else:
        _write_json(meta_path, meta)
    n = len(store)
    nchunks = math.ceil(n / opts.chunk_size)
    paths = [emb_dir / f"chunk_{c:06d}.npy" for c in range(nchunks)]
    todo = [c for c in range(nchunks) if not paths[c].exists()]
    encoder = None
    done = n - sum(min(opts.chunk_size, n - c * opts.chunk_size) for c in todo)
    with _tqdm(opts.progress, desc="encode", unit="doc", total=n, initial=done) as bar:
        for c in todo:
            if encoder is None:
                from llds_retriever.encoders import HFEncoder

                encoder = HFEncoder(spec, max_length=opts.max_length, device=opts.device)
            lo, hi = c * opts.chunk_size, min(n, (c + 1) * opts.chunk_size)
            vecs = np.empty((hi - lo, encoder.dim), dtype=np.float32)
            for s in range(lo, hi, opts.batch_size * 16):
                e = min(hi, s + opts.batch_size * 16)
                vecs[s - lo : e - lo] = encoder.encode_passages(
                    [store.contents(i) for i in range(s, e)], batch_size=opts.batch_size
                )
                bar.update(e - s)
            _atomic_save_npy(paths[c], vecs)
    return meta, paths


def _new_faiss_index(kind: str, dim: int, n: int, opts: BuildOptions) -> Any:
    import faiss

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        return faiss.IndexHNSWFlat(dim, opts.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    if kind == "ivfpq":
        nlist = opts.ivf_nlist or max(1, min(65_536, int(4 * math.sqrt(n))))
        m = opts.ivf_m or next(x for x in (48, 32, 24, 16, 12, 8, 6, 4, 2, 1) if dim % x == 0)
        if dim % m:
            raise IndexFormatError(f"ivf_m={m} does not divide the vector dimension {dim}")
        nbits = 8 if n >= 256 * 39 else max(1, int(math.log2(max(2, n // 39))))
        return faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    raise IndexFormatError(f"unknown index type {kind!r} ({', '.join(INDEX_TYPES)})")


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) row ranges of ``shards`` near-equal slices of ``n`` rows."""
    if not 1 <= shards <= max(1, n):
        raise IndexFormatError(f"cannot split {n} rows into {shards} shards")
    cuts = [round(i * n / shards) for i in range(shards + 1)]
    return list(itertools.pairwise(cuts))


def _iter_vectors(paths: list[Path], chunk_size: int, lo: int, hi: int) -> Any:
    """Yield (start_row, [m, D] vectors) covering rows [lo, hi) from the chunk files."""
    for c, p in enumerate(paths):
        c_lo, c_hi = c * chunk_size, (c + 1) * chunk_size
        if c_hi <= lo or c_lo >= hi:
            continue
        arr = np.load(p, mmap_mode="r")
        a, b = max(lo, c_lo) - c_lo, min(hi, c_lo + len(arr)) - c_lo
        yield c_lo + a, np.ascontiguousarray(arr[a:b], dtype=np.float32)


def _gather_rows(paths: list[Path], chunk_size: int, rows: np.ndarray) -> np.ndarray:
    """Vectors of the given sorted rows [m] -> [m, D], reading only the chunks that hold them."""
    parts = []
    for c in np.unique(rows // chunk_size):
        arr = np.load(paths[int(c)], mmap_mode="r")
        parts.append(np.asarray(arr[rows[rows // chunk_size == c] - c * chunk_size], dtype=np.float32))
    return np.ascontiguousarray(np.concatenate(parts))


def _build_faiss(paths: list[Path], n: int, opts: BuildOptions) -> list[dict[str, Any]]:
    import faiss

    dim = int(np.load(paths[0], mmap_mode="r").shape[1])
    shards = []
    for s, (lo, hi) in enumerate(shard_bounds(n, opts.shards)):
        name = f"dense.shard{s:03d}.index"
        index = _new_faiss_index(opts.index_type, dim, hi - lo, opts)
        if not index.is_trained:
            # Train on an even sample of the shard (at most 256 points per list, FAISS's own ceiling).
            want = min(hi - lo, 256 * max(index.nlist, 2**index.pq.nbits))
            rows = lo + np.linspace(0, hi - lo - 1, want).astype(np.int64)
            index.train(_gather_rows(paths, opts.chunk_size, rows))
        with _tqdm(opts.progress, desc=f"index shard {s}", unit="vec", total=hi - lo) as bar:
            for _, vecs in _iter_vectors(paths, opts.chunk_size, lo, hi):
                index.add(vecs)
                bar.update(len(vecs))
        tmp = opts.out / f".{name}.tmp"
        faiss.write_index(index, str(tmp))
        os.replace(tmp, opts.out / name)
        shards.append({"file": name, "offset": lo, "rows": hi - lo})
    return shards


def build_index(opts: BuildOptions) -> dict[str, Any]:
    """Build (or resume building) an index folder; returns its manifest."""
    if opts.kind not in KINDS:
        raise IndexFormatError(f"unknown index kind {opts.kind!r} ({', '.join(KINDS)})")
    if opts.index_type not in INDEX_TYPES:
        raise IndexFormatError(f"unknown index type {opts.index_type!r} ({', '.join(INDEX_TYPES)})")
    t0 = time.monotonic()
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / MANIFEST).unlink(missing_ok=True)
    n = _copy_corpus(opts.corpus, opts.out, opts.progress)
    store = CorpusStore(
        opts.out / "corpus.jsonl", np.load(opts.out / "corpus.offsets.npy", mmap_mode="r"), canonical=True
    )
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "kind": opts.kind,
        "num_docs": n,
        "corpus": "corpus.jsonl",
        "corpus_offsets": "corpus.offsets.npy",
        "source_corpus": str(opts.corpus.resolve()),
        "canonical": True,
    }
    try:
        if opts.kind in ("bm25", "hybrid"):
            manifest["bm25"] = _build_bm25(store, opts.out, opts.progress)
        if opts.kind in ("dense", "hybrid"):
            meta, paths = _encode_chunks(store, opts)
            manifest["dense"] = {
                **{k: meta[k] for k in ("encoder", "pooling", "query_prefix", "passage_prefix")},
                "dim": int(np.load(paths[0], mmap_mode="r").shape[1]),
                "index_type": opts.index_type,
                "shards": _build_faiss(paths, n, opts),
            }
    finally:
        store.close()
    manifest["build_seconds"] = round(time.monotonic() - t0, 3)
    manifest["created_at"] = time.time()
    _write_json(opts.out / MANIFEST, manifest)
    return manifest


def read_manifest(index_dir: Path) -> dict[str, Any]:
    """The manifest of a complete index folder."""
    path = index_dir / MANIFEST
    if not index_dir.is_dir():
        raise IndexFormatError(f"index folder {index_dir} does not exist")
    if not path.exists():
        raise IndexFormatError(f"{index_dir} has no {MANIFEST}: not an index, or its build did not finish")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: format {manifest.get('format')} (this server reads {FORMAT_VERSION})"
        )
    return manifest


def index_info(index_dir: Path) -> dict[str, Any]:
    """Manifest plus on-disk sizes, for ``llds index info``."""
    manifest = read_manifest(index_dir)
    size = sum(p.stat().st_size for p in index_dir.rglob("*") if p.is_file())
    return {**manifest, "path": str(index_dir.resolve()), "disk_bytes": size}


def open_corpus(index_dir: Path, manifest: dict[str, Any]) -> CorpusStore:
    """The index folder's corpus, memory-mapped."""
    offsets = np.load(index_dir / manifest["corpus_offsets"], mmap_mode="r")
    store = CorpusStore(index_dir / manifest["corpus"], offsets, canonical=bool(manifest.get("canonical")))
    if len(store) != manifest["num_docs"]:
        raise IndexFormatError(
            f"{index_dir}: corpus has {len(store)} rows, manifest says {manifest['num_docs']}"
        )
    return store
