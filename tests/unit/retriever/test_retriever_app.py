"""The HTTP edge in-process: Search-R1 bytes, 4xx for bad input, 503s, health, metrics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from llds_retriever.app import create_app
from llds_retriever.backends import Hits
from llds_retriever.config import RetrieverConfig
from llds_retriever.corpus import CorpusStore, scan_line_offsets
from llds_retriever.loader import Loaded

ROWS = [
    {"id": "a", "contents": '"Alpha"\nfirst passage'},
    {"id": "b", "contents": '"Béta"\nsecond passage, non-ASCII'},
    {"id": "c", "contents": '"Gamma"\nthird passage'},
]


class FakeBackend:
    """Scores row r as (r + 1) / 4 for every query, optionally slowly (unit tests only)."""

    kind = "fake"
    size = 3

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None):
        self.delay_s = delay_s
        self.gate = gate
        self.batches: list[list[str]] = []

    def search(self, queries: list[str], k: int) -> Hits:
        self.batches.append(list(queries))
        if self.gate is not None:
            self.gate.wait(5)
        time.sleep(self.delay_s)
        order = np.array([2, 1, 0][:k] + [-1] * max(0, k - 3))
        rows = np.tile(order, (len(queries), 1))
        scores = np.where(rows >= 0, (rows + 1) / 4, -np.inf).astype(np.float32)
        return Hits(scores, rows, [len(q) > 20 for q in queries])

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "num_docs": self.size}


@pytest.fixture()
def corpus(tmp_path: Path) -> CorpusStore:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return CorpusStore(path, scan_line_offsets(path))


@contextmanager
def _client(app: object) -> Iterator[TestClient]:
    with TestClient(app) as c:  # type: ignore[arg-type]
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
            time.sleep(0.02)
        yield c


@pytest.fixture()
def client(corpus: CorpusStore) -> Iterator[TestClient]:
    cfg = RetrieverConfig(max_topk=10, max_body_bytes=4096, response_extras=False)
    with _client(create_app(cfg, loaded=Loaded(FakeBackend(), corpus, {}))) as c:
        yield c


def search_r1_reference(results: list[list[dict[str, object]]], return_scores: bool) -> bytes:
    """What Search-R1's retrieval_server returns: a dict through FastAPI's JSONResponse."""
    resp = []
    for docs in results:
        if return_scores:
            resp.append([{"document": d["document"], "score": d["score"]} for d in docs])
        else:
            resp.append([d["document"] for d in docs])
    return json.dumps({"result": resp}, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("return_scores", [True, False])
def test_search_r1_wire_bytes(client: TestClient, return_scores: bool) -> None:
    r = client.post("/retrieve", json={"queries": ["q1", "q2"], "topk": 2, "return_scores": return_scores})
    assert r.status_code == 200
    scores = np.array([0.75, 0.5], dtype=np.float32).tolist()  # float32 values, as FAISS gives them
    expect = [[{"document": ROWS[2], "score": scores[0]}, {"document": ROWS[1], "score": scores[1]}]] * 2
    assert r.content == search_r1_reference(expect, return_scores)
    assert r.headers["x-request-id"]


def test_topk_default_and_fewer_hits_than_topk(client: TestClient) -> None:
    r = client.post("/retrieve", json={"queries": ["q"]})
    assert [d["id"] for d in r.json()["result"][0]] == ["c", "b", "a"]  # default topk 3
    r = client.post("/retrieve", json={"queries": ["q"], "topk": 5})
    assert len(r.json()["result"][0]) == 3


def test_extras_after_result(corpus: CorpusStore) -> None:
    app = create_app(RetrieverConfig(), loaded=Loaded(FakeBackend(), corpus, {}))
    with _client(app) as c:
        long_q = "a query that is definitely longer than twenty characters"
        r = c.post("/retrieve", json={"queries": ["q", long_q], "topk": 1, "request_id": "abc"})
        body = r.json()
        assert list(body) == ["result", "request_id", "truncated", "schema_version"]
        assert body["request_id"] == "abc" and r.headers["x-request-id"] == "abc"
        assert body["truncated"] == [False, True]
        assert r.content.startswith(b'{"result":[[{"id":"c"')


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queries": [], "topk": 3}, "queries: List should have at least 1 item"),
        ({"queries": [""]}, "queries[0]: String should have at least 1 character"),
        ({"queries": ["ok", "   "]}, "queries[1] is blank"),
        ({"queries": ["ok", 7]}, "queries[1]: Input should be a valid string"),
        ({"queries": ["ok", None]}, "queries[1]: Input should be a valid string"),
        ({"queries": "not a list"}, "queries: Input should be a valid list"),
        ({"queries": ["q"], "topk": 0}, "topk: Input should be greater than or equal to 1"),
        ({"queries": ["q"], "topk": 11}, "topk: Input should be less than or equal to 10"),
        ({"queries": ["q"], "topk": 1000}, "topk: Input should be less than or equal to 100"),
        ({"queries": ["q"], "top_k": 3}, "top_k: Extra inputs are not permitted"),
        ({"topk": 3}, "queries: Field required"),
    ],
)
def test_bad_input_is_422_with_a_message(client: TestClient, body: dict[str, object], message: str) -> None:
    app_backend = client.app.state.retriever["service"].backend  # type: ignore[attr-defined]
    before = len(app_backend.batches)
    r = client.post("/retrieve", json=body)
    assert r.status_code == 422
    assert message in r.json()["message"]
    assert isinstance(r.json()["detail"], list)
    assert len(app_backend.batches) == before  # nothing reached the backend


def test_invalid_json_is_422(client: TestClient) -> None:
    r = client.post("/retrieve", content=b'{"queries": [', headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "message" in r.json()


@pytest.mark.parametrize(
    "body",
    [
        b'{"queries": ["\\ud800"]}',  # a lone surrogate, as JSON escapes it (it was a 500)
        b'{"queries": ["ok", "a\\udfffb"]}',
        b'{"queries": ["ok"], "request_id": "\\ud83d"}',
        b'{"queries": ["\xff\xfe"]}',  # bytes that are not UTF-8
        b'{"queries": ["ok"], "request_id": "caf\xe9"}',
    ],
)
def test_strings_that_are_not_unicode_are_4xx_with_a_message(client: TestClient, body: bytes) -> None:
    r = client.post("/retrieve", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert r.json().get("message") or r.json()["detail"]


def test_a_request_id_header_that_is_not_utf8_stays_out_of_the_headers(client: TestClient) -> None:
    r = client.post("/retrieve", json={"queries": ["q"]}, headers=[(b"x-request-id", b"\xff\xed\xa0\x80")])
    assert r.status_code == 200 and "x-request-id" not in r.headers


def test_body_over_limit_is_413_declared_or_chunked(client: TestClient) -> None:
    big = json.dumps({"queries": ["x" * 3000, "y" * 3000]}).encode()
    r = client.post("/retrieve", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "4096-byte limit" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:
        yield big[:2000]
        yield big[2000:]

    r = client.post("/retrieve", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    # the accounting sits outside the limit: both refusals are counted
    registry = client.app.state.metrics.registry  # type: ignore[attr-defined]
    assert registry.get_sample_value("llds_retriever_requests_total", {"status": "413"}) == 2
    assert registry.get_sample_value("llds_retriever_errors_total", {"cause": "body_too_large"}) == 2


def test_cache_answers_repeats_without_the_backend(client: TestClient) -> None:
    backend = client.app.state.retriever["service"].backend  # type: ignore[attr-defined]
    client.post("/retrieve", json={"queries": ["same"], "topk": 2})
    n = len(backend.batches)
    r = client.post("/retrieve", json={"queries": ["same"], "topk": 2})
    assert r.status_code == 200 and len(backend.batches) == n
    client.post("/retrieve", json={"queries": ["same"], "topk": 3})  # other topk: a miss
    assert len(backend.batches) == n + 1
    text = client.get("/metrics").text
    assert "llds_retriever_cache_hits_total 1.0" in text


def test_health_starting_then_ok(corpus: CorpusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()

    def slow_load(config: RetrieverConfig) -> Loaded:
        gate.wait(5)
        return Loaded(FakeBackend(), corpus, {"index_dir": "x"})

    monkeypatch.setattr("llds_retriever.app.load", slow_load)
    with TestClient(create_app(RetrieverConfig(index_dir=Path("x")))) as c:
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "starting"
        r = c.post("/retrieve", json={"queries": ["q"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        gate.set()
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
            time.sleep(0.02)
        h = c.get("/health")
        assert h.json()["status"] == "ok" and h.json()["detail"]["num_docs"] == 3


def test_load_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from llds_retriever.errors import IndexFormatError

    def bad_load(config: RetrieverConfig) -> Loaded:
        raise IndexFormatError("no manifest.json")

    seen: list[BaseException] = []
    monkeypatch.setattr("llds_retriever.app.load", bad_load)
    with TestClient(create_app(RetrieverConfig(index_dir=Path("x")), on_load_error=seen.append)) as c:
        for _ in range(100):
            if seen:
                break
            time.sleep(0.02)
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "degraded"
        assert "no manifest.json" in h.json()["detail"]["error"]
        assert "failed to load" in c.post("/retrieve", json={"queries": ["q"]}).json()["detail"]


def test_saturated_server_answers_503_with_retry_after(corpus: CorpusStore) -> None:
    gate = threading.Event()
    backend = FakeBackend(gate=gate)
    cfg = RetrieverConfig(max_queue=2, max_batch=1, max_wait_ms=0, retry_after_s=3, cache_size=0)
    with _client(create_app(cfg, loaded=Loaded(backend, corpus, {}))) as c:
        results: list[int] = []

        def call(i: int) -> None:
            results.append(c.post("/retrieve", json={"queries": [f"q{i}"]}).status_code)

        ts = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for _ in range(100):
            if c.app.state.retriever["service"].batcher.in_flight == 2:  # type: ignore[attr-defined]
                break
            time.sleep(0.01)
        t0 = time.perf_counter()
        r = c.post("/retrieve", json={"queries": ["q9"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert time.perf_counter() - t0 < 1.0  # rejected at once, not after the queue drains
        gate.set()
        for t in ts:
            t.join()
        assert results == [200, 200]
        metrics = c.get("/metrics").text
        assert 'llds_retriever_requests_total{status="503"} 1.0' in metrics
        assert 'llds_retriever_errors_total{cause="unavailable"} 1.0' in metrics


def test_concurrent_requests_are_batched_and_metrics_exported(corpus: CorpusStore) -> None:
    backend = FakeBackend(delay_s=0.05)
    cfg = RetrieverConfig(max_wait_ms=20, max_batch=64, cache_size=0)
    with _client(create_app(cfg, loaded=Loaded(backend, corpus, {}))) as c:
        ts = [
            threading.Thread(target=c.post, args=("/retrieve",), kwargs={"json": {"queries": [f"q{i}"]}})
            for i in range(16)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(backend.batches) < 16
        assert sum(len(b) for b in backend.batches) == 16
        text = c.get("/metrics").text
        for name in (
            "llds_retriever_requests_total",
            "llds_retriever_errors_total",
            "llds_retriever_request_latency_seconds_bucket",
            "llds_retriever_batch_size_queries_bucket",
            "llds_retriever_queue_depth_queries",
            "llds_retriever_cache_hits_total",
            "llds_retriever_ready_bool 1.0",
        ):
            assert name in text
        assert 'llds_retriever_requests_total{status="200"} 16.0' in text
