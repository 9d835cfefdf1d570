"""``/agent/v1``: OpenAI's chat-completions API onto the search agent (scripted engine, in-memory
searcher, the tiny model's real tokenizer; no server, no lifespan)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rollout_fakes import FakeSearcher, ScriptedEngine

from llds_proto.messages import Document
from llds_proto.search_protocol import observation_ids, prompt_ids
from llds_rollout.agent import LoopSettings, run_episode
from llds_rollout.agent_api.logic import AgentAPIError, loop_settings, parse_request, question_of
from llds_rollout.answer_admission import AnswerAdmission
from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings
from llds_rollout.retrieval import RetrieverError

MODEL = "m"
QUESTION = "who wrote hamlet"
SEARCH = "<search> hamlet author </search>"
ANSWER = "<answer> William Shakespeare </answer>"
URL = "/agent/v1/chat/completions"


def ask(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], **kw}


class FailingSearcher(FakeSearcher):
    async def search(self, query: str, request_id: str | None = None) -> list[Document]:
        raise RetrieverError("connection refused (after 3 retries)")


def make(tokenizer: Any, turns: list[str] | None = None, searcher: Any = None, **over: Any) -> TestClient:
    """A client of a service that looks loaded: the scripted engine, the real tokenizer, a searcher."""
    settings = RolloutSettings.load(
        overrides={"model": MODEL, "train": False, "engine": {"type": "transformers"},
                   "max_body_bytes": 8192, **over}
    )  # fmt: skip
    engine = ScriptedEngine(tokenizer, [SEARCH, ANSWER] if turns is None else turns)
    app = create_app(settings, engine)
    service = app.state.service
    service.tokenizer = tokenizer
    service.searcher = searcher or FakeSearcher()
    return TestClient(app)


def engine_of(c: TestClient) -> ScriptedEngine:
    engine: ScriptedEngine = c.app.state.service.engine  # type: ignore[attr-defined]
    return engine


def events(text: str) -> list[Any]:
    """The ``data:`` payloads of an event stream, JSON-decoded (``[DONE]`` kept as the string)."""
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_answer_comes_back_in_openai_shape_with_the_searches_and_real_token_counts(tokenizer: Any) -> None:
    c = make(tokenizer)
    body = ask()
    body["messages"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"}, *body["messages"]]  # fmt: skip
    r = c.post(URL, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == MODEL
    assert out["id"] == f"chatcmpl-{out['llds']['request_id']}"
    assert out["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "William Shakespeare"},
                               "finish_reason": "stop", "logprobs": None}]  # fmt: skip
    trace = out["llds"]
    assert trace["answer"] == "William Shakespeare" and trace["finish_reason"] == "answer"
    assert trace["searches"] == 1 and trace["messages_ignored"] == 3
    assert [t["search_query"] for t in trace["turns"]] == ["hamlet author", None]
    assert [d["id"] for d in trace["turns"][0]["documents"]] == ["1", "2"]
    assert trace["weights_versions"] == [0] and trace["weights_version"] == 0
    # the question alone reached the agent: its prompt is the search protocol's, as /answer's
    engine = engine_of(c)
    prompt = prompt_ids(tokenizer, QUESTION)
    assert engine.requests[0].prompt_ids == prompt
    assert c.app.state.service.searcher.queries == ["hamlet author"]  # type: ignore[attr-defined]
    generated = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in (SEARCH, ANSWER))
    obs = observation_ids(tokenizer, [d.model_dump() for d in FakeSearcher().docs], 500)
    assert out["usage"] == {"prompt_tokens": len(prompt) + len(obs), "completion_tokens": generated,
                            "total_tokens": len(prompt) + len(obs) + generated}  # fmt: skip
    assert all(req.temperature == 0.0 for req in engine.requests)  # greedy unless asked


def test_text_parts_are_joined_into_the_question(tokenizer: Any) -> None:
    c = make(tokenizer)
    parts = [{"type": "text", "text": "who wrote"}, {"type": "text", "text": "hamlet"}]
    r = c.post(URL, json=ask(messages=[{"role": "user", "content": parts}]))
    assert r.status_code == 200, r.text
    assert engine_of(c).requests[0].prompt_ids == prompt_ids(tokenizer, "who wrote\nhamlet")


def test_sampling_turns_and_token_cap_reach_the_loop(tokenizer: Any) -> None:
    c = make(tokenizer)
    r = c.post(URL, json=ask(temperature=0.7, top_p=0.9, max_completion_tokens=5, max_tokens=99))
    assert r.status_code == 200, r.text
    out = r.json()
    engine = engine_of(c)
    assert [(q.temperature, q.top_p, q.max_tokens) for q in engine.requests] == [(0.7, 0.9, 5)]
    # five tokens of the search call, cut: no search, no answer, the cap ended it
    assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["message"]["content"] == ""
    assert out["llds"]["finish_reason"] == "length" and out["llds"]["answer"] is None
    assert out["usage"]["completion_tokens"] == 5
    assert c.app.state.service.searcher.queries == []  # type: ignore[attr-defined]

    c = make(tokenizer, turns=[SEARCH, SEARCH, SEARCH])
    r = c.post(URL, json=ask(max_tokens=1000, max_turns=1))
    assert r.status_code == 200, r.text
    # one search-enabled turn, then the final no-search turn, which never answered
    assert len(engine_of(c).requests) == 2 and r.json()["llds"]["finish_reason"] == "max_turns"
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_stream_sends_openai_chunks_a_turn_at_a_time_then_done(tokenizer: Any) -> None:
    c = make(tokenizer)
    r = c.post(URL, json=ask(stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = events(r.text)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert {ch["object"] for ch in chunks} == {"chat.completion.chunk"}
    assert len({ch["id"] for ch in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    turns = [ch["llds"]["turn"] for ch in chunks if "turn" in ch.get("llds", {})]
    assert [t["search_query"] for t in turns] == ["hamlet author", None]
    content = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert content == "William Shakespeare"
    finish = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop"
    assert finish[0]["llds"]["trace"]["turns"] == turns
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all("usage" not in ch for ch in chunks[:-1])

    r = c.post(URL, json=ask(stream=True))
    assert all("usage" not in ch for ch in events(r.text)[:-1])


@pytest.mark.parametrize(
    ("body", "status", "param", "code", "says"),
    [
        (ask(model="gpt-4o"), 404, "model", "model_not_found", "serves 'm'"),
        (ask(n=2), 400, "n", "unsupported_parameter", "one answer per request"),
        (ask(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools", "unsupported_parameter", "/v1"),
        (ask(logprobs=True), 400, "logprobs", "unsupported_parameter", "not returned"),
        (ask(stop=["x"]), 400, "stop", "unsupported_parameter", "</answer>"),
        (ask(response_format={"type": "json_object"}), 400, "response_format", "unsupported_parameter", "JSON"),
        (ask(seed=1), 400, "seed", "unsupported_parameter", "greedy"),
        (ask(frequency_penalty=0.5), 400, "frequency_penalty", "unsupported_parameter", "0.5"),
        (ask(top_k=5), 400, "top_k", "unrecognized_argument", "unrecognized request argument: top_k"),
        (ask(temperature=2.5), 400, "temperature", "invalid_value", "2.5"),
        (ask(max_completion_tokens=0), 400, "max_completion_tokens", "invalid_value", "greater than or equal to 1"),
        (ask(max_turns=0), 400, "max_turns", "invalid_value", "max_turns"),
        (ask(stream_options={"include_usage": True}), 400, "stream_options", "invalid_value", "stream = true"),
        (ask(messages=[]), 400, "messages", "invalid_value", "at least 1"),
        (ask(messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "x"}]),
         400, "messages[1].role", "invalid_value", "role 'assistant'"),
        (ask(messages=[{"role": "robot", "content": QUESTION}]), 400, "messages[0].role", "invalid_value", "robot"),
        (ask(messages=[{"role": "user", "content": "   "}]), 400, "messages[0].content", "invalid_value", "blank"),
        (ask(messages=[{"role": "user", "content": "x" * 5000}]), 400, "messages[0].content", "invalid_value", "4096"),
        (ask(messages=[{"role": "user"}]), 400, "messages[0].content", "invalid_value", "no content"),
        (ask(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
         400, "messages[0].content[0]", "invalid_value", "image_url"),
        ({"messages": [{"role": "user", "content": QUESTION}]}, 400, "model", "invalid_value", "model: Field required"),
    ],
)  # fmt: skip
def test_bad_and_unsupported_requests_get_openai_errors_naming_the_parameter(
    tokenizer: Any, body: dict[str, Any], status: int, param: str, code: str, says: str
) -> None:
    c = make(tokenizer)
    for stream in (False, True):
        r = c.post(URL, json={**body, "stream": stream} if "stream_options" not in body else body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
        assert says in err["message"], err["message"]
    assert engine_of(c).requests == []  # refused before the agent ran


@pytest.mark.parametrize(
    "neutral",
    [{"n": 1}, {"tools": []}, {"tool_choice": "none"}, {"logprobs": False}, {"presence_penalty": 0.0},
     {"frequency_penalty": 0}, {"response_format": {"type": "text"}}, {"stop": None}, {"user": "u-17"},
     {"parallel_tool_calls": False}, {"stream": None}],
)  # fmt: skip
def test_parameters_that_ask_for_nothing_are_accepted(tokenizer: Any, neutral: dict[str, Any]) -> None:
    r = make(tokenizer).post(URL, json=ask(**neutral))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[1, 2]", b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
     b'{"model": "m", "messages": [{"role": "user", "content": "caf\xe9"}]}', b"[" * 3000 + b"]" * 3000],
)  # fmt: skip
def test_bodies_that_are_not_json_objects_or_not_unicode_are_400(tokenizer: Any, raw: bytes) -> None:
    r = make(tokenizer).post(URL, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"]


def test_body_limit_applies(tokenizer: Any) -> None:
    r = make(tokenizer).post(URL, json=ask(user="x" * 9000))
    assert r.status_code == 413


def test_models_lists_the_served_id(tokenizer: Any) -> None:
    models = make(tokenizer).get("/agent/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["object"] == "model" and models["data"][0]["owned_by"] == "llds"


def test_the_v1_key_and_loopback_rule_guards_agent_v1(tokenizer: Any) -> None:
    c = make(tokenizer, api_key="k1")
    for method, path, body in (("POST", URL, ask()), ("GET", "/agent/v1/models", None)):
        r = c.request(method, path, json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
        r = c.request(method, path, json=body, headers={"Authorization": "Bearer k2"})
        assert r.status_code == 401
        r = c.request(method, path, json=body, headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200, r.text
    # auth before the body: a malformed request without the key is still a 401
    assert c.post(URL, content=b"junk").status_code == 401
    r = make(tokenizer, host="0.0.0.0").post(URL, json=ask())
    assert r.status_code == 403
    assert "api_key" in r.json()["error"]["message"] and "LLDS_API_KEY" in r.json()["error"]["message"]


def test_no_cors_headers(tokenizer: Any) -> None:
    c = make(tokenizer)
    pre = c.options(URL, headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST"})
    r = c.post(URL, json=ask(), headers={"Origin": "http://example.com"})
    assert r.status_code == 200
    for resp in (pre, r):
        assert not [h for h in resp.headers if h.lower().startswith("access-control-")], resp.headers


def test_agent_v1_takes_an_answer_slot_and_sheds_load_with_503(tokenizer: Any) -> None:
    c = make(tokenizer, turns=[ANSWER] * 4)
    service = c.app.state.service  # type: ignore[attr-defined]
    service.answer_admission = AnswerAdmission(max_in_flight=1, max_queued=0, retry_after_s=3.0)
    assert c.post(URL, json=ask()).status_code == 200
    assert c.post(URL, json=ask(stream=True)).status_code == 200
    assert service.answer_admission.in_flight == 0  # both released
    held = service.answer_admission.admit()
    for stream in (False, True):
        r = c.post(URL, json=ask(stream=stream))
        assert r.status_code == 503 and r.headers["retry-after"] == "3", r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "overloaded"
        assert "answer capacity full" in err["message"]
    held.release()
    assert c.post(URL, json=ask()).status_code == 200


def test_503_while_loading(tokenizer: Any) -> None:
    c = make(tokenizer)
    c.app.state.service.tokenizer = None  # type: ignore[attr-defined]
    r = c.post(URL, json=ask())
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"] == {"message": "model is still loading", "type": "server_error", "param": None,
                                 "code": "not_ready"}  # fmt: skip


def test_retriever_failure_is_503_or_an_error_event_once_streaming(tokenizer: Any) -> None:
    c = make(tokenizer, searcher=FailingSearcher())
    r = c.post(URL, json=ask())
    assert r.status_code == 503 and r.json()["error"]["code"] == "retriever_unavailable"
    assert "connection refused" in r.json()["error"]["message"]

    engine_of(c).turns = [SEARCH, ANSWER]
    r = c.post(URL, json=ask(stream=True))
    assert r.status_code == 200  # the failure came after the 200
    ev = events(r.text)
    assert ev[-1] == "[DONE]" and ev[-2]["error"]["code"] == "retriever_unavailable"
    assert not any(ch.get("choices") and ch["choices"][0]["finish_reason"] for ch in ev[:-2])
    assert c.app.state.service.answer_admission.in_flight == 0  # type: ignore[attr-defined]


def test_the_mapping_without_http() -> None:
    req = parse_request(json.dumps(ask(temperature=0, max_tokens=7, top_p=0.5)).encode())
    base = LoopSettings(max_turns=2, temperature=1.0, top_p=1.0)
    got = loop_settings(base, req)
    assert (got.temperature, got.top_p, got.max_new_tokens, got.max_turns) == (0.0, 0.5, 7, 2)
    got = loop_settings(base, parse_request(json.dumps(ask()).encode()))
    assert (got.temperature, got.top_p, got.max_new_tokens) == (0.0, 1.0, None)
    q = question_of(parse_request(json.dumps(ask(messages=[
        {"role": "developer", "content": "d"}, {"role": "tool", "content": None, "tool_call_id": "t"},
        {"role": "user", "content": QUESTION}])).encode()))  # fmt: skip
    assert (q.text, q.ignored) == (QUESTION, 2)
    with pytest.raises(AgentAPIError) as e:
        parse_request(json.dumps(ask(tools=list(range(100)))).encode())
    assert (
        e.value.status == 400 and "..." in e.value.message and "99" not in e.value.message
    )  # the echo is cut short


def test_token_cap_counts_every_turn(tokenizer: Any) -> None:
    """``max_new_tokens`` is a budget over all turns: a search that uses part of it leaves the rest."""
    search_len = len(tokenizer.encode(SEARCH, add_special_tokens=False))
    engine = ScriptedEngine(tokenizer, [SEARCH, ANSWER])
    ep = asyncio.run(
        run_episode(engine, FakeSearcher(), tokenizer, QUESTION, [],
                    LoopSettings(max_turns=2, max_tokens_per_turn=100, max_new_tokens=search_len + 3),
                    trajectory_id="t")
    )  # fmt: skip
    assert [r.max_tokens for r in engine.requests] == [search_len + 3, 3]
    assert ep.trajectory.finish_reason == "length" and ep.trajectory.num_valid_searches == 1
    assert sum(len(g.token_ids) for g in ep.generations) == search_len + 3
