"""From an OpenAI chat-completions request to the agent loop's inputs, and from the finished episode
to OpenAI's response and chunks. No web framework: the router in ``routes`` does the HTTP.

Conversations: the agent answers one question per request. The question is the last message, which
must be the user's; the earlier messages (a system prompt, previous turns) are not shown to the model,
whose prompt is the search protocol's own, and the response counts them in
``llds.messages_ignored``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import ValidationError

from llds_proto.messages import AnswerRequest, AnswerTurn
from llds_rollout.agent import LoopSettings
from llds_rollout.agent_api.protocol import (
    UNSUPPORTED,
    AgentTrace,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    ErrorDetail,
    ErrorResponse,
    StreamExtension,
    Usage,
)
from llds_rollout.answer_admission import AnswerSaturatedError
from llds_rollout.engine import EngineError
from llds_rollout.retrieval import RetrieverError
from llds_rollout.service import AgentRun, NotReadyError

DONE = "data: [DONE]\n\n"
"""The last event of every stream."""


class AgentAPIError(Exception):
    """A request ``/agent/v1`` refuses or cannot serve, with OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return ErrorResponse(
            error=ErrorDetail(message=self.message, type=kind, param=self.param, code=self.code)
        )


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _not_unicode(value: Any, loc: tuple[int | str, ...] = ()) -> tuple[int | str, ...] | None:
    """Where a string without a UTF-8 form (a lone surrogate a JSON ``\\ud800`` escape carries) is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return loc
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if isinstance(k, str) and _not_unicode(k) is not None:
            return loc
        found = _not_unicode(v, (*loc, k))
        if found is not None:
            return found
    return None


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """``value`` is one of ``neutral`` (``0`` and ``0.0`` alike, but ``False`` is not ``0``)."""
    return any(
        value == n and (isinstance(value, bool) is isinstance(n, bool)) and (value is None) is (n is None)
        for n in neutral
    )


def parse_request(raw: bytes) -> ChatCompletionRequest:
    """The request body, checked: :class:`AgentAPIError` (400) names the first bad parameter."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise AgentAPIError(
                400, f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json"
            )
        bad = _not_unicode(data)
    except UnicodeDecodeError as e:
        raise AgentAPIError(400, f"the body is not UTF-8: {e}", code="invalid_json") from e
    except ValueError as e:
        raise AgentAPIError(400, f"the body is not JSON: {e}", code="invalid_json") from e
    except RecursionError as e:
        raise AgentAPIError(400, "the body is nested too deeply", code="invalid_json") from e
    if bad is not None:
        raise AgentAPIError(
            400, f"{_path(bad) or 'a key'}: not a Unicode string (a lone surrogate)", param=_path(bad) or None,
            code="invalid_value",
        )  # fmt: skip
    for name, (neutral, why) in UNSUPPORTED.items():
        if name not in data:
            continue
        value = data.pop(name)
        if not _neutral(value, neutral):
            raise AgentAPIError(
                400,
                f"{name} = {_short(value)} is not supported by the search agent: {why}",
                param=name,
                code="unsupported_parameter",
            )
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = _path(err["loc"])
        if err["type"] == "extra_forbidden":
            raise AgentAPIError(
                400, f"unrecognized request argument: {where}", param=where, code="unrecognized_argument"
            ) from e
        raise AgentAPIError(
            400, f"{where}: {err['msg']} (got {_short(err['input'])})", param=where, code="invalid_value"
        ) from e
    if req.stream_options is not None and not req.stream:
        raise AgentAPIError(
            400,
            "stream_options is only allowed with stream = true",
            param="stream_options",
            code="invalid_value",
        )
    return req


def check_model(req: ChatCompletionRequest, served: str) -> None:
    """404 for a model id this service does not serve (as OpenAI and vLLM answer it)."""
    if req.model != served:
        raise AgentAPIError(
            404,
            f"model {_short(req.model)} is not served here: this service serves {served!r} (GET /agent/v1/models)",
            param="model",
            code="model_not_found",
        )


def _text(content: str | list[dict[str, Any]] | None, i: int) -> str:
    if content is None:
        raise AgentAPIError(
            400, f"messages[{i}] has no content: it must hold the question", param=f"messages[{i}].content",
            code="invalid_value",
        )  # fmt: skip
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise AgentAPIError(
                400,
                f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are read, "
                f"got type {_short(part.get('type'))}",
                param=f"messages[{i}].content[{j}]",
                code="invalid_value",
            )
        texts.append(part["text"])
    return "\n".join(texts)


@dataclass(frozen=True)
class Question:
    """What the agent is asked."""

    text: str
    ignored: int
    """Messages before it (not shown to the model)."""


def question_of(req: ChatCompletionRequest) -> Question:
    """The last message, the user's, as ``/answer`` would take it (not blank, at most
    ``MAX_QUESTION_CHARS``); 400 naming the message otherwise."""
    i = len(req.messages) - 1
    last = req.messages[i]
    if last.role != "user":
        raise AgentAPIError(
            400,
            f"the last message must be the user's question (role 'user'), got role {last.role!r}: the "
            "search agent answers one question per request",
            param=f"messages[{i}].role",
            code="invalid_value",
        )
    text = _text(last.content, i)
    try:
        AnswerRequest(question=text)
    except ValidationError as e:
        raise AgentAPIError(
            400, f"messages[{i}].content: {e.errors(include_url=False)[0]['msg']}",
            param=f"messages[{i}].content", code="invalid_value",
        ) from e  # fmt: skip
    return Question(text=text, ignored=i)


def loop_settings(base: LoopSettings, req: ChatCompletionRequest) -> LoopSettings:
    """``base`` (the service's ``/answer`` settings, greedy) with the request's sampling and token cap."""
    return replace(
        base,
        temperature=req.temperature or 0.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        max_new_tokens=req.max_completion_tokens or req.max_tokens,
    )


def service_error(e: Exception) -> AgentAPIError:
    """The 503 a service failure is answered with (Retry-After: come back, do not give up)."""
    if isinstance(e, AnswerSaturatedError):
        return AgentAPIError(503, str(e), code="overloaded", headers={"Retry-After": f"{e.retry_after_s:g}"})
    if isinstance(e, NotReadyError):
        return AgentAPIError(503, str(e), code="not_ready", headers={"Retry-After": "1"})
    if isinstance(e, RetrieverError):
        return AgentAPIError(
            503, f"retriever unavailable: {e}", code="retriever_unavailable", headers={"Retry-After": "1"}
        )
    if isinstance(e, EngineError):
        return AgentAPIError(
            503, f"engine unavailable: {e}", code="engine_unavailable", headers={"Retry-After": "1"}
        )
    raise TypeError(f"not a service failure: {e!r}") from e


SERVICE_ERRORS = (AnswerSaturatedError, NotReadyError, RetrieverError, EngineError)
"""What :func:`service_error` maps."""


def usage(run: AgentRun) -> Usage:
    ep = run.episode
    completion = sum(len(g.token_ids) for g in ep.generations)
    total = len(ep.trajectory.prompt_ids) + len(ep.trajectory.response_ids)
    return Usage(prompt_tokens=total - completion, completion_tokens=completion, total_tokens=total)


def trace(run: AgentRun, ignored: int) -> AgentTrace:
    t = run.episode.trajectory
    return AgentTrace(
        answer=t.answer,
        finish_reason=t.finish_reason,
        turns=run.episode.turns,
        searches=t.num_valid_searches,
        weights_version=run.versions[0],
        weights_versions=run.versions,
        messages_ignored=ignored,
        latency_s=run.latency_s,
        request_id=run.request_id,
    )


def _finish(run: AgentRun) -> Literal["stop", "length"]:
    return "length" if run.episode.trajectory.finish_reason in ("length", "context") else "stop"


def completion(run: AgentRun, *, model: str, created: int, ignored: int) -> ChatCompletion:
    """The non-streamed response."""
    return ChatCompletion(
        id=f"chatcmpl-{run.request_id}",
        created=created,
        model=model,
        choices=[
            Choice(
                message=AssistantMessage(content=run.episode.trajectory.answer or ""),
                finish_reason=_finish(run),
            )
        ],
        usage=usage(run),
        llds=trace(run, ignored),
    )


@dataclass(frozen=True)
class ChunkWriter:
    """The server-sent events of one streamed response, in OpenAI's chunk format.

    Order: a first chunk with the role; one chunk per finished turn (empty delta, the turn in
    ``llds.turn``); the answer as one content delta; a chunk with the finish reason and the whole
    trace (``llds.trace``); with ``include_usage`` a chunk with ``usage`` and no choices; ``[DONE]``.
    The engine does not stream tokens through the agent loop, so content comes in one piece at the end.
    """

    request_id: str
    model: str
    created: int
    ignored: int
    include_usage: bool

    def _event(self, choices: list[ChunkChoice], **kw: Any) -> str:
        chunk = ChatCompletionChunk(
            id=f"chatcmpl-{self.request_id}", created=self.created, model=self.model, choices=choices, **kw
        )
        return f"data: {chunk.model_dump_json()}\n\n"

    def start(self) -> str:
        return self._event([ChunkChoice(delta=Delta(role="assistant", content=""))])

    def turn(self, t: AnswerTurn) -> str:
        return self._event([ChunkChoice(delta=Delta())], llds=StreamExtension(turn=t))

    def done(self, run: AgentRun) -> list[str]:
        out = []
        if run.episode.trajectory.answer:
            out.append(self._event([ChunkChoice(delta=Delta(content=run.episode.trajectory.answer))]))
        out.append(
            self._event(
                [ChunkChoice(delta=Delta(), finish_reason=_finish(run))],
                llds=StreamExtension(trace=trace(run, self.ignored)),
            )
        )
        if self.include_usage:
            out.append(self._event([], usage=usage(run)))
        return out

    @staticmethod
    def error(e: Exception) -> str:
        """A failure after the 200 went out: OpenAI's error object as an event (``[DONE]`` follows)."""
        return f"data: {service_error(e).body().model_dump_json()}\n\n"
