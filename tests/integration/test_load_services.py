"""Bounded load on the real services (each its own process, loopback, tiny model, world BM25 index):
256 concurrent ``/retrieve`` clients and 32 concurrent ``/answer`` clients. The only non-200 answer
allowed is a deliberate 503 carrying ``Retry-After``; nothing hangs (every client finishes within
the run time plus one request timeout).

``LLDS_LOAD_SECONDS`` stretches the runs; ``LLDS_LOAD_REPORT=FILE.json`` writes the summaries
(the numbers in docs/load_bench.md come from such a run).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_kit import PY_CLI, Service, idle_connection_failure, retriever_service

from llds.loadtest import LoadResult, run_load
from llds_server.http import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("LLDS_LOAD_SECONDS", "8"))
REQUEST_TIMEOUT_S = 60.0
_REPORT: dict[str, Any] = {}


def _check(res: LoadResult, started: float, duration: float) -> dict[str, object]:
    summary = res.summary()
    print(json.dumps(summary))
    assert res.ok > 0, summary
    assert not res.errors, summary
    assert res.backpressure_without_retry_after == 0, summary
    assert time.monotonic() - started < duration + REQUEST_TIMEOUT_S + 5, "a client hung"
    return summary


@pytest.fixture(scope="module")
def services(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("load")
    ret, ret_url = retriever_service(logs)
    port = free_port()
    rollout = Service(
        "rollout",
        [*PY_CLI, "rollout", "serve", "--engine", "transformers", "--config", str(ROOT / "configs" / "rollout_tiny.toml"),
         "--model", str(tiny_model_dir), "--retriever-url", ret_url, "--no-train", "--port", str(port)],
        logs,
    )  # fmt: skip
    ret.start()
    rollout.start()
    try:
        ret.wait_healthy(ret_url)
        rollout.wait_healthy(f"http://127.0.0.1:{port}")
        yield {"retriever": ret_url, "rollout": f"http://127.0.0.1:{port}"}
        assert ret.running() and rollout.running(), ret.log() + rollout.log()
    finally:
        ret.stop()
        rollout.stop()
        if out := os.environ.get("LLDS_LOAD_REPORT"):
            Path(out).write_text(json.dumps(_REPORT, indent=2) + "\n")


def test_idle_keep_alive_connections_are_kept_across_a_turn(services: dict[str, str]) -> None:
    body = json.dumps({"queries": ["Kreixvelor Academy founder"], "topk": 1}).encode()
    assert idle_connection_failure(services["retriever"], "POST", "/retrieve", body) is None
    assert idle_connection_failure(services["rollout"], "GET", "/health") is None


def test_256_concurrent_retrieve_clients(services: dict[str, str]) -> None:
    t0 = time.monotonic()
    res = asyncio.run(
        run_load(f"{services['retriever']}/retrieve", "retrieve", 256, SECONDS, REQUEST_TIMEOUT_S)
    )
    _REPORT["retrieve"] = _check(res, t0, SECONDS)


def test_32_concurrent_answer_clients(services: dict[str, str]) -> None:
    t0 = time.monotonic()
    res = asyncio.run(run_load(f"{services['rollout']}/answer", "answer", 32, SECONDS, REQUEST_TIMEOUT_S))
    _REPORT["answer"] = _check(res, t0, SECONDS)
