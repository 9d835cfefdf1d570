"""The retriever as users run it: built with the CLI, served as a subprocess on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llds_server.http import free_port

pytestmark = pytest.mark.integration

TOPICS = [
    ("Paris", "Paris is the capital and largest city of France."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Jupiter", "Jupiter is the largest planet in the Solar System."),
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    ("Café", "A café serves coffee and small meals."),
]
INDEX_CMD = "import sys; from llds_retriever.cli import index_main; sys.exit(index_main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("retriever")
    corpus = root / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(TOPICS)
        )
    )
    out = root / "index"
    proc = subprocess.run(
        [sys.executable, "-c", INDEX_CMD, "build", "--corpus", str(corpus), "--kind", "hybrid", "--out", str(out), "--no-progress", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "kind=hybrid docs=5" in proc.stdout
    return out


class _Server:
    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "LLDS_RETRIEVER_BACKEND__TORCH_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llds_retriever", *args, "--host", "127.0.0.1", "--port", str(self.port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("retriever did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _serve(*args: str) -> Iterator[_Server]:
    server = _Server(*args)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def bm25_server(index_dir: Path) -> Iterator[_Server]:
    yield from _serve("--index", str(index_dir), "--type", "bm25")


@pytest.fixture(scope="module")
def dense_server(index_dir: Path) -> Iterator[_Server]:
    yield from _serve(
        "--index", str(index_dir), "--type", "dense", "--max-wait-ms", "20", "--cache-size", "0"
    )


def passages2string(retrieval_result: list[dict[str, object]]) -> str:
    """Search-R1's own formatting of /retrieve results (search_r1/llm_agent/generation.py)."""
    format_reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]  # type: ignore[index]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
    return format_reference


def test_search_r1_client_works_unchanged(bm25_server: _Server) -> None:
    # Exactly what Search-R1's agent sends and reads.
    payload = {"queries": ["capital of Germany", "largest planet"], "topk": 3, "return_scores": True}
    result = httpx.post(bm25_server.url + "/retrieve", json=payload).json()["result"]
    assert len(result) == 2
    assert passages2string(result[0]).startswith('Doc 1(Title: "Berlin") Berlin is the capital of Germany.\n')
    assert result[1][0]["document"] == {
        "id": "2",
        "contents": '"Jupiter"\nJupiter is the largest planet in the Solar System.',
    }
    assert result[0][0]["score"] > 0
    plain = httpx.post(bm25_server.url + "/retrieve", json={"queries": ["Shakespeare"], "topk": 1}).json()
    assert plain["result"] == [
        [{"id": "3", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'}]
    ]
    assert plain["request_id"]


def test_health_and_metrics(bm25_server: _Server) -> None:
    h = httpx.get(bm25_server.url + "/health").json()
    assert h["status"] == "ok" and h["detail"]["kind"] == "bm25" and h["detail"]["num_docs"] == 5
    text = httpx.get(bm25_server.url + "/metrics").text
    assert "llds_retriever_requests_total" in text and "llds_retriever_index_documents 5.0" in text


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"queries": []}, "queries"),
        ({"queries": [""]}, "queries[0]"),
        ({"queries": [1]}, "queries[0]"),
        ({"queries": ["a"], "topk": 0}, "topk"),
        ({"queries": ["a"], "topk": 101}, "topk"),
        ({"queries": ["a"], "unknown": True}, "unknown"),
    ],
)
def test_bad_input_over_http(bm25_server: _Server, body: dict[str, object], needle: str) -> None:
    r = httpx.post(bm25_server.url + "/retrieve", json=body)
    assert r.status_code == 422
    assert needle in r.json()["message"]


def test_oversized_body_is_413(bm25_server: _Server) -> None:
    body = json.dumps({"queries": ["x" * 4000] * 300}).encode()  # ~1.2 MB, over the 1 MiB default
    r = httpx.post(bm25_server.url + "/retrieve", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_concurrent_requests_share_batches(dense_server: _Server) -> None:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=dense_server.url, timeout=60) as c:
            qs = [f"question number {i} about the capital of France" for i in range(32)]
            return await asyncio.gather(*(c.post("/retrieve", json={"queries": [q], "topk": 2}) for q in qs))

    responses = asyncio.run(main())
    assert all(r.status_code == 200 for r in responses)
    assert all(r.json()["result"][0][0]["id"] == "0" for r in responses)  # Paris
    metrics = httpx.get(dense_server.url + "/metrics").text
    count = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("llds_retriever_batch_size_queries_count")
    )
    total = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("llds_retriever_batch_size_queries_sum")
    )
    assert total == 32 and count < 32  # several requests per encoder call


def test_server_exits_when_the_index_cannot_load(tmp_path: Path) -> None:
    server = _Server("--index", str(tmp_path / "missing"))
    try:
        code = server.proc.wait(timeout=60)
        out = server.proc.stdout.read() if server.proc.stdout else ""
    finally:
        server.stop()
    assert code == 1
    assert "does not exist" in out
