"""HTTP surface of the rollout service: /answer, vLLM's OpenAI-compatible /v1 routes, admin routes
(the trainer's signed requests, or an operator's bearer token), /health, /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from llds_proto.admin_auth import SIGNATURE_HEADER, SignatureError, Verifier
from llds_proto.messages import (
    AnswerRequest,
    AnswerResponse,
    HealthResponse,
    WeightTransferInfo,
    WeightTransferInit,
    WeightTransferUpdate,
    WeightUpdateNotice,
    WeightUpdateResponse,
)
from llds_rollout.agent_api import routes as agent_api
from llds_rollout.answer_admission import AnswerSaturatedError
from llds_rollout.api_access import refusal
from llds_rollout.config import RolloutSettings
from llds_rollout.engine import Engine, EngineError, WeightSwapError
from llds_rollout.engine.transfer import WeightTransferError, WeightTransferStateError
from llds_rollout.retrieval import RetrieverError
from llds_rollout.service import AgentRun, NotProducingError, NotReadyError, RolloutService
from llds_rollout.weights import WeightsError
from llds_server.http import BodyLimitMiddleware, invalid_request

log = logging.getLogger("llds_rollout.app")


# 503s are transient (loading, retriever or engine down): clients should come back, not give up.
RETRY_AFTER = {"Retry-After": "1"}


class OpenAIRoutes:
    """Requests under ``/v1/`` go to the engine's OpenAI-compatible app (vLLM's own routes).

    404 when the backend does not offer them (the message names the setting), 503 while the model
    loads; everything else passes through to the service's routes.
    """

    def __init__(self, app: ASGIApp, service: RolloutService) -> None:
        self.app = app
        self.service = service

    def _refused(self, scope: Scope) -> JSONResponse | None:
        """The rule of :func:`llds_rollout.api_access.refusal`, answered as ``{"detail"}``."""
        s = self.service.settings
        given = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        why = refusal(s.api_key, s.host, given, "/v1")
        if why is None:
            return None
        return JSONResponse({"detail": why.message}, status_code=why.status, headers=why.headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        engine = self.service.settings.engine
        target = self.service.engine.openai_asgi
        if target is not None:
            refused = self._refused(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
            # The same slots as /answer: a flood of /v1 requests gets 503s, never the training's CPU.
            try:
                ticket = self.service.answer_admission.admit()
            except AnswerSaturatedError as e:
                self.service.metrics.answers_rejected.inc()
                busy = JSONResponse(
                    {"detail": str(e)}, status_code=503, headers={"Retry-After": f"{e.retry_after_s:g}"}
                )
                await busy(scope, receive, send)
                return
            try:
                await ticket.wait()
                await target(scope, receive, send)
            finally:
                ticket.release()
            return
        if engine.type != "vllm" or not engine.openai_api:
            detail = (
                "the OpenAI-compatible /v1 routes need engine.type = 'vllm' and engine.openai_api = true "
                f"(this service runs engine.type = {engine.type!r}, openai_api = {engine.openai_api})"
            )
            resp = JSONResponse({"detail": detail}, status_code=404)
        else:
            why = self.service.engine.failed or "model is still loading"
            resp = JSONResponse({"detail": why}, status_code=503, headers=RETRY_AFTER)
        await resp(scope, receive, send)


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
    agent_api.install(app, service)
    app.add_middleware(OpenAIRoutes, service=service)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)  # outermost

    verifier = (
        Verifier(settings.admin_token, [settings.replica()[1], *settings.admin_urls],
                 settings.admin_signature_window_s)
        if settings.admin_token
        else None
    )  # fmt: skip

    async def require_admin(
        request: Request,
        authorization: str | None = Header(default=None),
        signature: str | None = Header(default=None, alias=SIGNATURE_HEADER),
    ) -> None:
        """The trainer's signed request (for this replica's own URL), or an operator's bearer token."""
        if verifier is None:
            raise HTTPException(403, "admin disabled: no LLDS_ADMIN_TOKEN configured")
        if signature is not None:
            try:
                verifier.verify(signature, request.method, request.url.path, await request.body())
            except SignatureError as e:
                log.warning("refused a signed admin request to %s: %s", request.url.path, e)
                raise HTTPException(401, f"bad {SIGNATURE_HEADER}: {e}") from e
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), verifier.key.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return invalid_request(e.errors())

    @app.exception_handler(NotReadyError)
    async def _not_ready(_: Request, e: NotReadyError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=503, headers=RETRY_AFTER)

    @app.exception_handler(AnswerSaturatedError)
    async def _saturated(_: Request, e: AnswerSaturatedError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(e)}, status_code=503, headers={"Retry-After": f"{e.retry_after_s:g}"}
        )

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

    @app.exception_handler(WeightTransferStateError)
    async def _transfer_state(_: Request, e: WeightTransferStateError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=409)

    @app.exception_handler(WeightSwapError)
    async def _swap_failed(_: Request, e: WeightSwapError) -> JSONResponse:
        return JSONResponse({"detail": f"weights swap failed: {e}"}, status_code=502)

    @app.exception_handler(WeightTransferError)
    async def _transfer_failed(_: Request, e: WeightTransferError) -> JSONResponse:
        return JSONResponse({"detail": f"NCCL weight transfer failed: {e}"}, status_code=502)

    @app.get("/health", response_model=HealthResponse)
    async def health() -> JSONResponse:
        h = service.health()
        return JSONResponse(h.model_dump(), status_code=200 if h.status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            service.metrics.render() + service.engine.metrics_text(), media_type=CONTENT_TYPE_LATEST
        )

    @app.post("/answer", response_model=AnswerResponse)
    async def answer(req: AnswerRequest) -> AnswerResponse:
        return await service.answer(req)

    @app.post("/answer/stream")
    async def answer_stream(req: AnswerRequest) -> StreamingResponse:
        """Server-sent events: ``turn`` (an AnswerTurn) per finished turn, then ``done`` (the
        AnswerResponse) or ``error`` (``{"detail"}``) if the retriever or engine fails mid-way."""
        # Before the 200 goes out: not ready or no slot is still a plain 503.
        ticket = service.admit_answer()
        events = service.stream_agent(
            req.question, service.loop_settings(train=False, max_turns=req.max_turns), ticket
        )

        async def stream() -> AsyncIterator[str]:
            async with contextlib.aclosing(events):
                async for kind, item in events:
                    if isinstance(item, AgentRun):
                        data = item.response().model_dump_json()
                    elif isinstance(item, Exception):
                        data = json.dumps({"detail": f"{type(item).__name__}: {item}"})
                    else:
                        data = item.model_dump_json()
                    yield f"event: {kind}\ndata: {data}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/admin/weights", response_model=WeightUpdateResponse, dependencies=[Depends(require_admin)])
    async def weights(notice: WeightUpdateNotice) -> WeightUpdateResponse:
        return await service.update_weights(notice)

    @app.get(
        "/admin/weight_transfer", response_model=WeightTransferInfo, dependencies=[Depends(require_admin)]
    )
    async def weight_transfer_info() -> WeightTransferInfo:
        """This replica's place in an NCCL group (409 unless started with engine.weight_transfer = nccl)."""
        return service.weight_transfer_info()

    @app.post(
        "/admin/weight_transfer/init",
        response_model=WeightTransferInfo,
        dependencies=[Depends(require_admin)],
    )
    async def weight_transfer_init(req: WeightTransferInit) -> WeightTransferInfo:
        """Join the trainer's NCCL group; answers once every rank has met."""
        return await service.init_weight_transfer(req)

    @app.post(
        "/admin/weight_transfer/update",
        response_model=WeightUpdateResponse,
        dependencies=[Depends(require_admin)],
    )
    async def weight_transfer_update(req: WeightTransferUpdate) -> WeightUpdateResponse:
        """Receive one version over the group between requests; 400 leaves the old weights serving."""
        return await service.receive_weights(req)

    @app.post("/admin/pause", dependencies=[Depends(require_admin)])
    async def pause() -> dict[str, Any]:
        service.pause()
        return {"paused": True}

    @app.post("/admin/resume", dependencies=[Depends(require_admin)])
    async def resume() -> dict[str, Any]:
        service.resume()
        return {"paused": False}

    return app
