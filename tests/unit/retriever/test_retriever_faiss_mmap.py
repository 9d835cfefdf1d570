"""FAISS files are really memory-mapped when ``mmap = true`` (flat ones included), and the retriever
says which it got.

The witness is the kernel's, not the loader's bookkeeping: a fresh process reads an index of a few
MB, then ``/proc/self/smaps`` must (or must not) list a mapping of the file, and the process's
anonymous memory (``RssAnon``, what reading into RAM costs) must stay flat (or grow by the file).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest

from llds_retriever.config import RetrieverConfig
from llds_retriever.loader import load

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")

_PROBE = r"""
import json, sys
from pathlib import Path
import numpy as np

def rss_anon_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

def mapped_kib(path):
    # total size of the mappings of ``path`` in /proc/self/smaps
    total, current = 0, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and "-" in fields[0] and ":" in fields[3]:
            current = " ".join(fields[5:])
        elif fields and fields[0] == "Size:" and current == path:
            total += int(fields[1])
    return total

path, mode = sys.argv[1], sys.argv[2]
import faiss
from llds_retriever.backends import read_faiss, storage_of
queries = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
before = rss_anon_kib()
if mode == "faiss_mmap_only":  # the flag the retriever used before
    index = faiss.read_index(path, faiss.IO_FLAG_MMAP)
else:
    index = read_faiss(Path(path), mode == "mmap")
after = rss_anon_kib()
_, rows = index.search(queries, 5)
print(json.dumps({"anon_kib": after - before, "mapped_kib": mapped_kib(path), "storage": storage_of(Path(path)),
                  "rows": rows.tolist(), "ntotal": index.ntotal}))
"""


def _write(path: Path, factory: str, n: int = 20_000) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    index = faiss.index_factory(64, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    faiss.write_index(index, str(path))
    return x


def _probe(path: Path, mode: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _PROBE, str(path.resolve()), mode], capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("factory", ["Flat", "HNSW16", "IVF32,Flat"])
def test_mmap_maps_the_file_and_keeps_it_out_of_anonymous_memory(tmp_path: Path, factory: str) -> None:
    path = tmp_path / "x.index"
    _write(path, factory)
    file_kib = path.stat().st_size // 1024
    assert file_kib > 4000  # a few MB, well above allocator noise

    mapped = _probe(path, "mmap")
    assert mapped["storage"] == "memory-mapped"
    assert mapped["mapped_kib"] >= file_kib  # type: ignore[operator]
    assert mapped["anon_kib"] < file_kib // 4  # type: ignore[operator]

    in_ram = _probe(path, "ram")
    assert in_ram["storage"] == "in RAM"
    assert in_ram["mapped_kib"] == 0
    assert in_ram["anon_kib"] > file_kib * 0.9  # type: ignore[operator]
    assert mapped["rows"] == in_ram["rows"] and mapped["ntotal"] == in_ram["ntotal"] == 20_000


def test_the_old_flag_alone_reads_a_flat_index_into_ram(tmp_path: Path) -> None:
    """Why ``read_faiss`` uses ``IO_FLAG_MMAP_IFC``: ``IO_FLAG_MMAP`` leaves a flat index unmapped."""
    path = tmp_path / "flat.index"
    _write(path, "Flat")
    got = _probe(path, "faiss_mmap_only")
    assert got["storage"] == "in RAM" and got["mapped_kib"] == 0
    assert got["anon_kib"] > path.stat().st_size // 1024 * 0.9  # type: ignore[operator]


def test_health_facts_and_log_line_say_where_the_index_is(
    hybrid_index: Path, corpus_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llds.retriever")
    mapped = load(RetrieverConfig(index_dir=hybrid_index, backend={"device": "cpu"}))
    assert mapped.backend.describe()["dense"]["storage"] == "memory-mapped"
    lines = [r.getMessage() for r in caplog.records if "event=faiss_loaded" in r.getMessage()]
    assert len(lines) == 2 and all("storage='memory-mapped'" in line for line in lines)  # two shards

    in_ram = load(
        RetrieverConfig(index_dir=hybrid_index, mmap=False, backend={"type": "dense", "device": "cpu"})
    )
    assert in_ram.backend.describe()["storage"] == "in RAM"

    vecs = np.concatenate([np.load(p) for p in sorted((hybrid_index / "embeddings").glob("chunk_*.npy"))])
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    path = tmp_path / "e5_Flat.index"
    faiss.write_index(flat, str(path))
    bare = load(
        RetrieverConfig(faiss_index=path, corpus=corpus_file, backend={"encoder": "minilm", "device": "cpu"})
    )
    assert bare.backend.describe()["storage"] == "memory-mapped"
