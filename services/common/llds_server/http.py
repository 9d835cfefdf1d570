"""HTTP plumbing shared by the services: a body-size limit, 422s with a message, uvicorn on a background
thread, free ports."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import uvicorn
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

KEEP_ALIVE_S = 75
"""Seconds a server keeps an idle keep-alive connection (uvicorn's default is 5). An agent holds its
connection to the retriever across a generation turn, and a client under load can take seconds between
reading one response and sending the next request: with 5 s the server closes the socket in that gap,
and the request written into it fails with a reset (``ReadError``) instead of waiting its turn."""


def uvicorn_config(app: Any, host: str, port: int, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn configuration every service serves with: :data:`KEEP_ALIVE_S` and ``kwargs``."""
    return uvicorn.Config(app, host=host, port=port, timeout_keep_alive=KEEP_ALIVE_S, **kwargs)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) keeps traffic on this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def unicode_safe(value: Any) -> Any:
    """``value`` with each string that has no UTF-8 form (a lone surrogate, which a JSON ``\\ud800``
    escape carries into a parsed body) written with backslash escapes instead, at every nesting level."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {unicode_safe(k): unicode_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [unicode_safe(v) for v in value]
    return value


def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def invalid_request(errors: Sequence[Any]) -> JSONResponse:
    """422 for a request that failed validation: FastAPI's ``detail`` list beside a ``message`` naming
    each bad field. Echoed input that is not valid Unicode is escaped (:func:`unicode_safe`): encoding
    it as it is fails, and the client would get a 500 for its own bad string."""
    detail = unicode_safe(jsonable_encoder(list(errors)))
    message = "invalid request: " + "; ".join(f"{_loc(e['loc'])}: {e['msg']}" for e in detail)
    return JSONResponse({"detail": detail, "message": message}, status_code=422)


class _BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes the limit (FastAPI answers it as a 413)."""


class BodyLimitMiddleware:
    """413 for bodies over ``max_body_bytes``, declared or streamed (chunked), before any parsing."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            detail = f"request body of {declared.decode(errors='replace')} bytes exceeds the {self.limit}-byte limit"
            await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge(413, f"request body exceeds the {self.limit}-byte limit")
            return msg

        async def tracked_send(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _BodyTooLarge as e:  # an app without FastAPI's HTTPException handling
            if started:
                raise
            await JSONResponse({"detail": e.detail}, status_code=413)(scope, receive, send)


class BackgroundServer:
    """``with BackgroundServer(app) as srv: httpx.get(srv.url + "/health")``.

    uvicorn on a daemon thread (benchmarks and tests need servers in-process; the trainer serves
    HTTP beside its training loop). ``port=0`` picks a free one.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.server = uvicorn.Server(
            uvicorn_config(app, host=host, port=self.port, log_level=log_level, lifespan="on")
        )
        self.thread = threading.Thread(target=self._serve, name=f"uvicorn-{self.port}", daemon=True)

    def _serve(self) -> None:
        try:
            self.server.run()
        except SystemExit:  # uvicorn's way to fail start-up (port taken, say); start() reports it
            pass

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        """Start serving; RuntimeError if it does not within ``timeout_s`` (port in use, say)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.host}:{self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask uvicorn to exit and wait up to ``timeout_s`` for it."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=timeout_s)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
