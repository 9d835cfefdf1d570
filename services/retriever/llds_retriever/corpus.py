"""Corpus JSONL access by row number, memory-mapped so a 21M-passage corpus costs no RAM.

A corpus is JSON lines ``{"id": ..., "contents": "\\"Title\\"\\ntext", ...}``; row i is line i and is
the id every index uses. ``CorpusStore`` keeps only the line start offsets (8 bytes per passage, itself
memory-mapped) and slices lines out of the mapped file on demand.

Documents go on the wire exactly as Search-R1's server sends them: the corpus row re-serialised by
``json.dumps(row, ensure_ascii=False, separators=(",", ":"))``. Corpora written by the index builder
are already in that form (``canonical``), so their lines are sent as they are, without a parse.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from llds_retriever.errors import CorpusError

_BLOCK = 64 << 20


def canonical_json(row: Any) -> bytes:
    """The bytes Starlette's ``JSONResponse`` (and so Search-R1's server) writes for ``row``."""
    return json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def scan_line_offsets(path: Path) -> np.ndarray:
    """Start offset of every non-empty-terminated line, plus the file size: shape [n + 1], uint64.

    Vectorised over 64 MiB blocks so wiki-18 (14 GB) scans at disk speed.
    """
    size = path.stat().st_size
    starts = [np.zeros(1, dtype=np.uint64)]
    with path.open("rb") as f:
        base = 0
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10).astype(np.uint64)
            starts.append(nl + np.uint64(base + 1))
            base += len(block)
    offsets = np.concatenate(starts)
    if offsets[-1] != size:
        # The last line has no trailing newline: its end is the file size.
        offsets = np.append(offsets, np.uint64(size))
    return offsets


def cache_root() -> Path:
    """``$LLDS_CACHE_DIR`` (default ``~/.cache/llds``), the same root the launcher's assets use."""
    return Path(os.environ.get("LLDS_CACHE_DIR", Path.home() / ".cache" / "llds")).expanduser()


def _cached_offsets(path: Path) -> np.ndarray:
    """Offsets of a corpus not written by our builder, cached by (path, size, mtime)."""
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_root() / "retriever" / "offsets" / f"{path.stem}-{key}.npy"
    if cached.exists():
        return np.load(cached, mmap_mode="r")
    offsets = scan_line_offsets(path)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, offsets)
    os.replace(tmp, cached)
    return offsets


def parse_row(line: bytes, lineno: int, path: Path) -> dict[str, Any]:
    """One corpus line as a dict with string ``id`` and ``contents``; CorpusError names the line."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(f"{path}:{lineno + 1}: not valid JSON ({e.msg})") from e
    if not isinstance(row, dict):
        raise CorpusError(f"{path}:{lineno + 1}: expected a JSON object, got {type(row).__name__}")
    for key in ("id", "contents"):
        if not isinstance(row.get(key), str):
            raise CorpusError(f'{path}:{lineno + 1}: field "{key}" missing or not a string')
    return row


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Validated rows of a corpus JSONL, in order; blank lines are an error (they would shift ids)."""
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    with path.open("rb") as f:
        for i, line in enumerate(f):
            if not line.strip():
                raise CorpusError(f"{path}:{i + 1}: blank line (row numbers would no longer match ids)")
            yield parse_row(line, i, path)


class CorpusStore:
    """Row-number access to a corpus JSONL file through ``mmap``; safe to share between threads."""

    def __init__(self, path: Path, offsets: np.ndarray | None = None, canonical: bool = False):
        if not path.is_file():
            raise CorpusError(f"corpus file {path} does not exist")
        self.path = path
        self.canonical = canonical
        self.offsets = _cached_offsets(path) if offsets is None else offsets
        if int(self.offsets[-1]) != path.stat().st_size:
            raise CorpusError(f"corpus {path} changed since its offsets were computed; rebuild the index")
        self._file = path.open("rb")
        size = path.stat().st_size
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, row: int) -> bytes:
        """Line ``row`` without its line ending."""
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        return bytes(self._mm[start:end]).rstrip(b"\r\n")

    def doc(self, row: int) -> dict[str, Any]:
        """Row ``row`` as a dict."""
        return parse_row(self.raw(row), row, self.path)

    def contents(self, row: int) -> str:
        """The ``contents`` field of row ``row`` (what every backend indexes)."""
        return str(self.doc(row)["contents"])

    def doc_json(self, row: int) -> bytes:
        """Row ``row`` as the exact bytes Search-R1's server would send for it."""
        raw = self.raw(row)
        return raw if self.canonical else canonical_json(parse_row(raw, row, self.path))

    def close(self) -> None:
        """Release the mapping and the file."""
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file.close()
