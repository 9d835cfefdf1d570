"""HTTP surface of the rollout service: /answer, admin routes behind a bearer token, /health, /metrics."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llds_proto.messages import (
    AnswerRequest,
    AnswerResponse,
    HealthResponse,
    WeightUpdateNotice,
    WeightUpdateResponse,
)
from llds_rollout.config import RolloutSettings
from llds_rollout.engine import Engine, EngineError
from llds_rollout.retrieval import RetrieverError
from llds_rollout.service import NotProducingError, NotReadyError, RolloutService
from llds_rollout.weights import WeightsError

log = logging.getLogger("llds_rollout.app")
# 503s are transient (loading, retriever or engine down): clients should come back, not give up.
RETRY_AFTER = {"Retry-After": "1"}


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

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, f"request body exceeds the {self.limit}-byte limit")
            return msg

        await self.app(scope, limited_receive, send)


def create_app(settings: RolloutSettings, engine: Engine | None = None) -> FastAPI:
    """The FastAPI app; the model loads in the background after start-up (/health says when)."""
    service = RolloutService(settings, engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(service.start())
        try:
            yield
        finally:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await service.stop()

    app = FastAPI(title="llds rollout", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)

    def require_admin(authorization: str | None = Header(default=None)) -> None:
        token = settings.admin_token
        if not token:
            raise HTTPException(403, "admin disabled: no LLDS_ADMIN_TOKEN configured")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(NotReadyError)
    async def _not_ready(_: Request, e: NotReadyError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=503, headers=RETRY_AFTER)

    @app.exception_handler(RetrieverError)
    async def _retriever(_: Request, e: RetrieverError) -> JSONResponse:
        return JSONResponse({"detail": f"retriever unavailable: {e}"}, status_code=503, headers=RETRY_AFTER)

    @app.exception_handler(EngineError)
    async def _engine(_: Request, e: EngineError) -> JSONResponse:
        return JSONResponse({"detail": f"engine unavailable: {e}"}, status_code=503, headers=RETRY_AFTER)

    @app.exception_handler(WeightsError)
    async def _weights(_: Request, e: WeightsError) -> JSONResponse:
        return JSONResponse({"detail": f"weights rejected (old weights keep serving): {e}"}, status_code=400)

    @app.exception_handler(NotProducingError)
    async def _not_producing(_: Request, e: NotProducingError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=409)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> JSONResponse:
        h = service.health()
        return JSONResponse(h.model_dump(), status_code=200 if h.status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/answer", response_model=AnswerResponse)
    async def answer(req: AnswerRequest) -> AnswerResponse:
        return await service.answer(req)

    @app.post("/answer/stream")
    async def answer_stream(req: AnswerRequest) -> StreamingResponse:
        """Server-sent events: ``turn`` (an AnswerTurn) per finished turn, then ``done`` (the
        AnswerResponse) or ``error`` (``{"detail"}``) if the retriever or engine fails mid-way."""
        service.require_ready()  # before the 200 goes out: not-ready is still a plain 503
        events: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()

        async def run() -> None:
            try:
                resp = await service.answer(
                    req, on_turn=lambda t: events.put_nowait(("turn", t.model_dump_json()))
                )
                events.put_nowait(("done", resp.model_dump_json()))
            except (RetrieverError, EngineError, NotReadyError) as e:
                events.put_nowait(("error", json.dumps({"detail": f"{type(e).__name__}: {e}"})))
            finally:
                events.put_nowait(None)

        async def stream() -> AsyncIterator[str]:
            task = asyncio.create_task(run())
            try:
                while (item := await events.get()) is not None:
                    yield f"event: {item[0]}\ndata: {item[1]}\n\n"
            finally:
                task.cancel()

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/admin/weights", response_model=WeightUpdateResponse, dependencies=[Depends(require_admin)])
    async def weights(notice: WeightUpdateNotice) -> WeightUpdateResponse:
        return await service.update_weights(notice)

    @app.post("/admin/pause", dependencies=[Depends(require_admin)])
    async def pause() -> dict[str, Any]:
        service.pause()
        return {"paused": True}

    @app.post("/admin/resume", dependencies=[Depends(require_admin)])
    async def resume() -> dict[str, Any]:
        service.resume()
        return {"paused": False}

    return app
