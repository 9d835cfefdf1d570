"""Request and response models of ``/agent/v1``: OpenAI's chat-completions shapes, plus the ``llds``
extension object that carries the agent's searches.

Not in ``proto/``: no other service of this project speaks it; its clients are OpenAI clients.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llds_proto.messages import AnswerTurn

AgentFinish = Literal["answer", "max_turns", "length", "context"]
"""How the agent's conversation ended (``Trajectory.finish_reason``)."""

# --------------------------------------------------------------------------------------------
# Request
# --------------------------------------------------------------------------------------------


class ChatMessage(BaseModel):
    """One message of the conversation. Only the last one is read (the question); earlier ones may
    carry whatever OpenAI's API allows (``name``, ``tool_calls``, ...)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    """Who wrote it; the last message must be the user's."""
    content: str | list[dict[str, Any]] | None = None
    """Text, or a list of content parts (only ``{"type": "text", "text": ...}`` parts are read)."""


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    """Send one more chunk before ``[DONE]`` with ``usage`` and no choices."""


class ChatCompletionRequest(BaseModel):
    """Body of ``POST /agent/v1/chat/completions``: the supported part of OpenAI's request.

    Parameters the agent cannot honour are listed in :data:`UNSUPPORTED` and refused unless given
    their neutral value; any other unknown parameter is refused as unrecognised.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    """The served model's id (``GET /agent/v1/models``); another id is a 404."""
    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation; the last message, a user's, is the question."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Tokens the model may generate over all its turns (searches and answer); unset: the service's
    per-turn and context caps only."""
    max_tokens: int | None = Field(default=None, ge=1)
    """OpenAI's older name of ``max_completion_tokens``, read when that is unset."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature of every turn; unset or 0: greedy, as ``/answer``."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus mass when sampling; unset: 1."""
    stream: bool | None = False
    """Server-sent events in OpenAI's chunk format, one chunk per finished turn, then ``[DONE]``."""
    stream_options: StreamOptions | None = None
    """``include_usage`` (streaming only)."""
    user: str | None = Field(default=None, max_length=256)
    """An end user's id: written to the service's log line, not used otherwise."""
    max_turns: int | None = Field(default=None, ge=1, le=16)
    """llds extension: search-enabled turns before the final no-search turn; unset: the service's
    ``answer_max_turns``."""


UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((None, 1), "the agent gives one answer per request (n = 1)"),
    "tools": ((None, []), "the agent's one tool is its own search; the bare model at /v1 takes tools"),
    "tool_choice": ((None, "none", "auto"), "the agent's one tool is its own search"),
    "functions": ((None, []), "the agent's one tool is its own search"),
    "function_call": ((None, "none", "auto"), "the agent's one tool is its own search"),
    "parallel_tool_calls": ((None, True, False), ""),
    "logprobs": ((None, False), "log-probs of the agent's turns are not returned"),
    "top_logprobs": ((None, 0), "log-probs of the agent's turns are not returned"),
    "response_format": ((None, {"type": "text"}), "the answer is free text (no JSON mode)"),
    "stop": ((None, []), "the agent stops at its own tags (</search>, </answer>)"),
    "seed": ((None,), "no per-request seed: leave temperature unset (greedy) for repeatable answers"),
    "logit_bias": ((None, {}), "no logit bias on the agent's turns"),
    "presence_penalty": ((None, 0), "no penalties on the agent's turns"),
    "frequency_penalty": ((None, 0), "no penalties on the agent's turns"),
    "modalities": ((None, ["text"]), "text only"),
    "audio": ((None,), "text only"),
    "prediction": ((None,), "no predicted outputs"),
    "reasoning_effort": ((None,), "the agent's effort is its search turns (max_turns)"),
    "web_search_options": ((None,), "the agent searches its own retriever"),
    "store": ((None, False), "nothing is stored"),
    "metadata": ((None, {}), "nothing is stored"),
    "service_tier": ((None, "auto", "default"), "one service tier"),
}
"""OpenAI request parameters the agent does not implement: name -> (values that ask for nothing, so
are accepted, why any other value is refused)."""


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


def _unset(v: Any) -> bool:
    return v is None


class Usage(BaseModel):
    """Token counts of the whole conversation, prompt to answer."""

    prompt_tokens: int
    """Tokens the model read that it did not write: the prompt, plus the search results and
    invalid-action feedback put between its turns."""
    completion_tokens: int
    """Tokens the model generated, over all its turns."""
    total_tokens: int
    """Their sum: the length of the final context."""


class AgentTrace(BaseModel):
    """The ``llds`` extension object: how the agent reached its answer."""

    answer: str | None
    """Content of the final ``<answer>``; null when the model never answered."""
    finish_reason: AgentFinish
    """``answer``, ``max_turns`` (the no-search turn ended without one), ``length`` (a token cap)
    or ``context`` (``max_context_tokens``)."""
    turns: list[AnswerTurn]
    """Every assistant turn: its text, and for a search its query and the documents returned."""
    searches: int
    """Valid search calls made."""
    weights_version: int
    """Oldest policy version that produced a token of this answer."""
    weights_versions: list[int]
    """Every policy version that produced a token, ascending (one under ``answer_consistency =
    "version"``)."""
    messages_ignored: int
    """Messages before the question, which the agent does not read."""
    latency_s: float
    """Server-side wall time of the agent loop."""
    request_id: str
    """Also the response's ``id`` suffix and the server's log line's ``request_id``."""


class AssistantMessage(BaseModel):
    """``choices[0].message``."""

    role: Literal["assistant"] = "assistant"
    """Always the assistant."""
    content: str
    """The agent's answer (the ``<answer>`` text); empty when it never answered."""


class Choice(BaseModel):
    """The one choice of a response."""

    index: int = 0
    """Always 0 (n = 1)."""
    message: AssistantMessage
    """The answer."""
    finish_reason: Literal["stop", "length"]
    """``length`` when a token cap ended the agent before it answered, else ``stop``."""
    logprobs: None = None
    """Not returned."""


class ChatCompletion(BaseModel):
    """Response of ``POST /agent/v1/chat/completions`` without ``stream``."""

    id: str
    """``chatcmpl-<request_id>``."""
    object: Literal["chat.completion"] = "chat.completion"
    """OpenAI's object type."""
    created: int
    """Unix time the request was received."""
    model: str
    """The served model's id."""
    choices: list[Choice]
    """One choice."""
    usage: Usage
    """Token counts."""
    llds: AgentTrace
    """The agent's searches and turns."""


class Delta(BaseModel):
    """What a chunk adds to the message."""

    role: Literal["assistant"] | None = Field(default=None, exclude_if=_unset)
    """In the first chunk only."""
    content: str | None = Field(default=None, exclude_if=_unset)
    """Text added to ``content``: empty in the first chunk, the answer in the last but one."""


class ChunkChoice(BaseModel):
    """The one choice of a chunk."""

    index: int = 0
    """Always 0."""
    delta: Delta
    """What this chunk adds."""
    finish_reason: Literal["stop", "length"] | None = None
    """Set in the chunk that ends the choice."""
    logprobs: None = None
    """Not returned."""


class StreamExtension(BaseModel):
    """The ``llds`` object of a chunk: a finished turn, or (with the finish reason) the whole trace."""

    turn: AnswerTurn | None = Field(default=None, exclude_if=_unset)
    """A turn as it finished (a search with its documents, or the answer)."""
    trace: AgentTrace | None = Field(default=None, exclude_if=_unset)
    """The whole trace, in the chunk that carries the finish reason."""


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed response (``data: <chunk>``)."""

    id: str
    """The same for every chunk of a response."""
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    """OpenAI's object type."""
    created: int
    """Unix time the request was received."""
    model: str
    """The served model's id."""
    choices: list[ChunkChoice]
    """One choice; none in the usage chunk."""
    usage: Usage | None = Field(default=None, exclude_if=_unset)
    """In the last chunk, with ``stream_options.include_usage``."""
    llds: StreamExtension | None = Field(default=None, exclude_if=_unset)
    """The agent's turns as they finish, and its trace at the end."""


class ModelCard(BaseModel):
    """One entry of ``GET /agent/v1/models``."""

    id: str
    """What a request's ``model`` must be."""
    object: Literal["model"] = "model"
    """OpenAI's object type."""
    created: int
    """Unix time the service started."""
    owned_by: str = "llds"
    """Always ``llds``."""


class ModelList(BaseModel):
    """Response of ``GET /agent/v1/models``."""

    object: Literal["list"] = "list"
    """OpenAI's object type."""
    data: list[ModelCard]
    """The one served model."""


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    """What was wrong, naming the bad value or setting."""
    type: str
    """``invalid_request_error`` (4xx) or ``server_error`` (503)."""
    param: str | None = None
    """The request parameter at fault, if one is."""
    code: str | None = None
    """A short machine-readable cause (``model_not_found``, ``unsupported_parameter``, ...)."""


class ErrorResponse(BaseModel):
    """Body of every ``/agent/v1`` error."""

    error: ErrorDetail
    """The error."""
