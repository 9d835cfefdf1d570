"""HTTP surface of the retriever: ``POST /retrieve`` (Search-R1 wire format), ``GET /health``, ``GET /metrics``.

The index loads in a background thread after start-up, so ``/health`` answers ``starting`` (503) until
it is ready; ``/retrieve`` answers 503 with ``Retry-After`` meanwhile and whenever the admission queue
is full. Malformed requests never reach the encoder: they get 413 (body too large) or 422 with a
``message`` naming the problem beside FastAPI's usual ``detail`` list.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llds_proto.messages import HealthResponse, RetrieveRequest, RetrieveResponse
from llds_retriever.config import RetrieverConfig
from llds_retriever.errors import RetrieverError, SaturatedError
from llds_retriever.loader import Loaded, load
from llds_retriever.metrics import RetrieverMetrics
from llds_retriever.service import RetrieverService
from llds_server.http import BodyLimitMiddleware, invalid_request

log = logging.getLogger("llds.retriever")


class AccountingMiddleware:
    """Status counts and latency of ``/retrieve``, 413s from the body limit inside it included."""

    def __init__(self, app: ASGIApp, metrics: RetrieverMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self._count(scope, status)
            if status == 200 and scope["path"] == "/retrieve":
                self.metrics.latency.observe(time.perf_counter() - t0)

    def _count(self, scope: Scope, status: int) -> None:
        if scope["path"] == "/retrieve":
            self.metrics.requests.labels(status=str(status)).inc()
            if status != 200:
                self.metrics.errors.labels(cause=_CAUSES.get(status, "internal")).inc()


_CAUSES = {413: "body_too_large", 422: "invalid_request", 503: "unavailable", 400: "bad_request"}


def _unavailable(message: str, retry_after_s: int) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=503, headers={"Retry-After": str(retry_after_s)})


def create_app(
    config: RetrieverConfig,
    loaded: Loaded | None = None,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The retriever app; it loads what ``config`` names (or serves ``loaded``) once started."""
    metrics = RetrieverMetrics()
    state: dict[str, Any] = {"service": None, "error": None}

    async def _load() -> None:
        t0 = time.monotonic()
        try:
            got = loaded if loaded is not None else await asyncio.to_thread(load, config)
            service = RetrieverService(got, config, metrics)
            await service.batcher.start()
        except Exception as e:  # reported on /health and to the CLI, which exits
            state["error"] = f"{type(e).__name__}: {e}"
            log.error("event=load_failed error=%r", state["error"])
            if on_load_error is not None:
                on_load_error(e)
            return
        state["service"] = service
        metrics.ready.set(1)
        metrics.index_docs.set(service.backend.size)
        log.info(
            "event=ready kind=%s docs=%d load_s=%.2f",
            service.backend.kind,
            service.backend.size,
            time.monotonic() - t0,
        )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_load())
        try:
            yield
        finally:
            task.cancel()
            service: RetrieverService | None = state["service"]
            if service is not None:
                await service.batcher.stop()
                if loaded is None:
                    service.corpus.close()

    app = FastAPI(title="llds retriever", version="1", lifespan=lifespan)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=config.max_body_bytes)
    app.add_middleware(AccountingMiddleware, metrics=metrics)  # outermost: counts the 413s too
    app.state.retriever = state
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_request(exc.errors())

    @app.post(
        "/retrieve",
        response_model=None,
        responses={
            200: {"model": RetrieveResponse},
            413: {"description": "Body too large"},
            503: {"description": "Index loading or server saturated; see Retry-After"},
        },
    )
    async def retrieve(body: RetrieveRequest, request: Request) -> Response:
        """Search-R1 ``/retrieve``: one ranked list of documents per query."""
        if body.topk > config.max_topk:
            raise RequestValidationError(
                [
                    {
                        "type": "less_than_equal",
                        "loc": ("body", "topk"),
                        "msg": f"Input should be less than or equal to {config.max_topk}",
                        "input": body.topk,
                        "ctx": {"le": config.max_topk},
                    }
                ]
            )
        service: RetrieverService | None = state["service"]
        if service is None:
            msg = (
                "index is still loading"
                if state["error"] is None
                else f"index failed to load: {state['error']}"
            )
            return _unavailable(msg, config.retry_after_s)
        rid = body.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        try:
            results = await service.retrieve(body.queries, body.topk)
        except SaturatedError as e:
            log.warning("event=saturated request_id=%s queued=%d", rid, service.batcher.in_flight)
            return _unavailable(str(e), e.retry_after_s)
        except RetrieverError as e:
            log.error("event=retrieve_failed request_id=%s error=%r", rid, str(e))
            return JSONResponse({"detail": str(e), "request_id": rid}, status_code=500)
        extras = (
            {
                "request_id": rid,
                "truncated": [r.truncated for r in results],
                "schema_version": body.schema_version,
            }
            if config.response_extras
            else None
        )
        content = service.render(results, body.return_scores, extras)
        log.debug("event=retrieve request_id=%s queries=%d topk=%d", rid, len(body.queries), body.topk)
        # A client id that cannot be an HTTP header value (non-ASCII, control characters) stays in the body only.
        headers = {"X-Request-ID": rid} if rid.isascii() and rid.isprintable() else {}
        return Response(content, media_type="application/json", headers=headers)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> JSONResponse:
        """``ok`` (200) once the index is loaded; ``starting`` or ``degraded`` (503) before/instead."""
        service: RetrieverService | None = state["service"]
        if service is None:
            status: Literal["starting", "degraded"] = "starting" if state["error"] is None else "degraded"
            detail: dict[str, Any] = {} if state["error"] is None else {"error": state["error"]}
            body = HealthResponse(status=status, service="retriever", detail=detail)
            return JSONResponse(body.model_dump(), status_code=503)
        detail = {
            **service.backend.describe(),
            **service.source,
            "cache_entries": len(service.cache),
            "queue_depth": service.batcher.in_flight,
        }
        return JSONResponse(HealthResponse(status="ok", service="retriever", detail=detail).model_dump())

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text exposition."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
