"""``/agent/v1/chat/completions`` and ``/agent/v1/models``: the search agent for OpenAI clients
(``base_url = http://HOST:PORT/agent/v1``). Same key, loopback rule and answer slots as ``/v1``; no
CORS headers (as ``/v1``); every error in OpenAI's ``{"error": {...}}`` shape."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llds_rollout.agent_api.logic import (
    DONE,
    SERVICE_ERRORS,
    AgentAPIError,
    ChunkWriter,
    check_model,
    completion,
    loop_settings,
    parse_request,
    question_of,
    service_error,
)
from llds_rollout.agent_api.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from llds_rollout.api_access import refusal
from llds_rollout.service import AgentRun, RolloutService, new_request_id

PREFIX = "/agent/v1"
ROUTE = f"{PREFIX}/chat/completions"


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its ``$defs`` substituted in place (an OpenAPI request body cannot
    point into a schema's own ``$defs``)."""
    defs = schema.pop("$defs", {})

    def sub(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return sub(defs[ref.removeprefix("#/$defs/")])
            return {k: sub(v) for k, v in node.items()}
        if isinstance(node, list):
            return [sub(v) for v in node]
        return node

    inlined: dict[str, Any] = sub(schema)
    return inlined


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse} for c in codes}


def served_model(service: RolloutService) -> str:
    """The model id ``/agent/v1`` answers to: the same as ``/v1``'s (``engine.served_model_name``,
    else ``model``)."""
    return service.settings.engine.served_model_name or service.settings.model


def install(app: FastAPI, service: RolloutService) -> None:
    """Add the ``/agent/v1`` routes and their error handler to ``app``."""
    started = int(time.time())

    @app.exception_handler(AgentAPIError)
    async def _agent_error(_: Request, e: AgentAPIError) -> JSONResponse:
        return JSONResponse(e.body().model_dump(mode="json"), status_code=e.status, headers=e.headers)

    async def authorize(request: Request) -> None:
        s = service.settings
        why = refusal(s.api_key, s.host, request.headers.get("authorization"), PREFIX)
        if why is not None:
            code = "invalid_api_key" if why.status == 401 else "api_key_required"
            raise AgentAPIError(why.status, why.message, code=code, headers=why.headers)

    router = APIRouter(prefix=PREFIX, dependencies=[Depends(authorize)], tags=["agent (OpenAI-compatible)"])

    @router.get("/models", response_model=ModelList, responses=_errors(401, 403))
    async def models() -> ModelList:
        """The one model the agent runs (its ``id`` is what a request's ``model`` must be)."""
        return ModelList(data=[ModelCard(id=served_model(service), created=started)])

    @router.post(
        "/chat/completions",
        response_model=ChatCompletion,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "JSON, or events with stream = true"},
            **_errors(400, 401, 403, 404, 503),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": _inline(ChatCompletionRequest.model_json_schema())}
                },
            }
        },
    )
    async def chat_completions(request: Request) -> Response:
        """The search agent on the last user message: OpenAI's response, the answer as the message's
        content and the searches in ``llds``; ``stream`` sends a chunk per finished turn."""
        created = int(time.time())
        req = parse_request(await request.body())
        model = served_model(service)
        check_model(req, model)
        q = question_of(req)
        loop = loop_settings(service.loop_settings(train=False, max_turns=req.max_turns), req)
        request_id = new_request_id()
        try:
            # Before the 200 goes out: not ready or no slot is still a plain 503.
            ticket = service.admit_answer()
        except SERVICE_ERRORS as e:
            raise service_error(e) from e
        if not req.stream:
            try:
                run = await service.run_agent(
                    q.text, loop, request_id=request_id, ticket=ticket, route=ROUTE, user=req.user
                )
            except SERVICE_ERRORS as e:
                raise service_error(e) from e
            body = completion(run, model=model, created=created, ignored=q.ignored)
            return Response(body.model_dump_json(), media_type="application/json")

        events = service.stream_agent(q.text, loop, ticket, request_id=request_id, route=ROUTE, user=req.user)
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        writer = ChunkWriter(request_id, model, created, q.ignored, include_usage)

        async def stream() -> AsyncIterator[str]:
            async with contextlib.aclosing(events):
                yield writer.start()
                async for _, item in events:
                    if isinstance(item, AgentRun):
                        for event in writer.done(item):
                            yield event
                    elif isinstance(item, Exception):
                        yield writer.error(item)
                    else:
                        yield writer.turn(item)
                yield DONE

        return StreamingResponse(stream(), media_type="text/event-stream")

    app.include_router(router)
