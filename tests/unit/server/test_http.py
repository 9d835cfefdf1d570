"""llds_server.http: the body limit, uvicorn on a thread, free ports; and the package's import rule."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from llds_server.http import BackgroundServer, BodyLimitMiddleware, free_port

LIMIT = 1024


def _echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    return app


async def _bare_echo(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app with no exception handling of its own: reads the whole body, answers 200."""
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _chunks(total: int, size: int = 256) -> Iterator[bytes]:
    for i in range(0, total, size):
        yield b"x" * min(size, total - i)


@pytest.fixture()
def client() -> TestClient:
    app = _echo_app()
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=LIMIT)
    return TestClient(app)


def test_declared_body_over_the_limit_is_413(client: TestClient) -> None:
    r = client.post("/echo", content=b"x" * (LIMIT + 1))
    assert r.status_code == 413
    assert r.json() == {"detail": f"request body of {LIMIT + 1} bytes exceeds the {LIMIT}-byte limit"}


def test_chunked_body_over_the_limit_is_413(client: TestClient) -> None:
    r = client.post("/echo", content=_chunks(LIMIT * 3))  # a generator: no Content-Length, chunked
    assert r.status_code == 413
    assert r.json() == {"detail": f"request body exceeds the {LIMIT}-byte limit"}


def test_chunked_body_over_the_limit_is_413_without_fastapi() -> None:
    c = TestClient(BodyLimitMiddleware(_bare_echo, max_body_bytes=LIMIT))
    r = c.post("/", content=_chunks(LIMIT * 3))
    assert r.status_code == 413
    assert r.json() == {"detail": f"request body exceeds the {LIMIT}-byte limit"}
    assert c.post("/", content=_chunks(LIMIT)).status_code == 200


def test_bodies_at_or_under_the_limit_pass(client: TestClient) -> None:
    assert client.post("/echo", content=b"x" * LIMIT).json() == {"bytes": LIMIT}
    assert client.post("/echo", content=_chunks(LIMIT)).json() == {"bytes": LIMIT}
    assert client.get("/ping").json() == {"pong": "yes"}


def test_a_garbage_content_length_is_413() -> None:
    async def never_called(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the app must not see the request")

    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg: dict[str, object]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"content-length", b"12abc")]}
    asyncio.run(BodyLimitMiddleware(never_called, LIMIT)(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 413


def test_background_server_serves_until_stopped() -> None:
    srv = BackgroundServer(_echo_app()).start()
    try:
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        assert httpx.get(srv.url + "/ping").json() == {"pong": "yes"}
    finally:
        srv.stop()
    assert not srv.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/ping", timeout=2)


def test_background_server_as_a_context_manager() -> None:
    with BackgroundServer(_echo_app(), log_level="error") as srv:
        assert httpx.post(srv.url + "/echo", content=b"abc").json() == {"bytes": 3}
    assert not srv.thread.is_alive()


def test_background_server_raises_when_the_port_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        srv = BackgroundServer(_echo_app(), port=taken.getsockname()[1], log_level="critical")
        with pytest.raises(RuntimeError, match="did not start"):
            srv.start(timeout_s=10)
    srv.stop()  # nothing left running; stopping is harmless


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_llds_server_imports_no_service_and_no_torch_or_vllm() -> None:
    code = (
        "import sys, llds_server, llds_server.http, llds_server.settings\n"
        "bad = {'torch', 'vllm', 'transformers', 'llds', 'llds_retriever', 'llds_rollout', 'llds_trainer'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
