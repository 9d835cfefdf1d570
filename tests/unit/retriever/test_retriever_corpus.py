"""Corpus access by row: offsets, canonical bytes, and clear errors on malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llds_retriever.corpus import CorpusStore, canonical_json, iter_rows, scan_line_offsets
from llds_retriever.errors import CorpusError


def test_offsets_with_and_without_trailing_newline(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_bytes(b'{"x":1}\n{"x":22}\n')
    assert scan_line_offsets(a).tolist() == [0, 8, 17]
    b = tmp_path / "b.jsonl"
    b.write_bytes(b'{"x":1}\n{"x":22}')
    assert scan_line_offsets(b).tolist() == [0, 8, 16]


def test_store_returns_rows_and_search_r1_bytes(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [{"id": "1", "contents": '"Café"\nà la carte', "extra": 3}, {"id": "2", "contents": '"B"\ntext'}]
    # Written with json.dumps defaults (", " separators, \\u escapes): not the canonical form.
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = CorpusStore(path, np.asarray(scan_line_offsets(path)))
    assert len(store) == 2
    assert store.doc(0) == rows[0]
    assert store.contents(1) == '"B"\ntext'
    # What Starlette's JSONResponse (Search-R1's server) would send for that row.
    assert store.doc_json(0) == json.dumps(rows[0], ensure_ascii=False, separators=(",", ":")).encode()
    assert store.doc_json(0) == canonical_json(rows[0])
    store.close()


def test_store_detects_changed_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id":"1","contents":"a"}\n')
    offsets = scan_line_offsets(path)
    path.write_text('{"id":"1","contents":"ab"}\n')
    with pytest.raises(CorpusError, match="changed"):
        CorpusStore(path, offsets)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"id":"1","contents":"a"}\n\n{"id":"2","contents":"b"}\n', "2: blank line"),
        ('{"id":"1"}\n', 'field "contents" missing'),
        ('{"id":1,"contents":"a"}\n', 'field "id" missing or not a string'),
        ("[1, 2]\n", "expected a JSON object"),
        ("{not json\n", "not valid JSON"),
    ],
)
def test_malformed_corpus_names_the_line(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(CorpusError, match=match):
        list(iter_rows(path))


def test_offsets_of_foreign_corpus_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLDS_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "wiki.jsonl"
    path.write_text('{"id":"1","contents":"\\"T\\"\\nx"}\n{"id":"2","contents":"\\"U\\"\\ny"}\n')
    store = CorpusStore(path)
    assert store.doc(1)["id"] == "2"
    assert len(list((tmp_path / "cache" / "retriever" / "offsets").glob("wiki-*.npy"))) == 1
    store.close()
