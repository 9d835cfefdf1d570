"""``/agent/v1`` through the official ``openai`` client: the real rollout service on loopback (the
transformers engine, the tiny model), a real ``/retrieve`` server, plain and streamed.

The tiny model is random, so a wrapper biases chosen tokens at chosen positions to make turn 1 search
"hamlet author" and turn 2 answer (``test_rollout_service``'s engine and script).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from test_rollout_service import QUESTION, TestEngine, _search_then_answer_script, _wait, retriever_app

from llds_proto.search_protocol import prompt_ids
from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings
from llds_server.http import BackgroundServer, free_port

pytestmark = pytest.mark.integration

KEY = "agent-key"


@pytest.fixture(scope="module")
def agent(tiny_model_dir: Path) -> Iterator[tuple[str, str, TestEngine, Any, list[dict[str, Any]]]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    calls: list[dict[str, Any]] = []
    with BackgroundServer(retriever_app(calls)) as retriever:
        settings = RolloutSettings.load(
            overrides={"model": str(tiny_model_dir), "retriever_url": retriever.url, "train": False,
                       "engine": {"type": "transformers"}, "api_key": KEY, "answer_max_turns": 2,
                       "max_tokens_per_turn": 40}
        )  # fmt: skip
        script = _search_then_answer_script(tok, "hamlet author", "William Shakespeare")
        engine = TestEngine(str(tiny_model_dir), script=script)
        with BackgroundServer(create_app(settings, engine)) as srv:
            _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, what="model load")
            yield srv.url, str(tiny_model_dir), engine, tok, calls


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/agent/v1", api_key=key, max_retries=0, timeout=60)


def test_openai_client_gets_the_agents_answer_searches_and_token_counts(agent: Any) -> None:
    url, model, engine, tok, calls = agent
    c = client(url)
    assert [m.id for m in c.models.list()] == [model]
    n = len(calls)
    resp = c.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "answer briefly"}, {"role": "user", "content": QUESTION}],
        user="it-1",
    )
    assert resp.object == "chat.completion" and resp.model == model
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "William Shakespeare"
    assert choice.finish_reason == "stop"
    trace = resp.llds  # type: ignore[attr-defined]
    assert trace["answer"] == "William Shakespeare" and trace["searches"] == 1
    assert trace["messages_ignored"] == 1 and resp.id == f"chatcmpl-{trace['request_id']}"
    assert trace["turns"][0]["search_query"] == "hamlet author"
    assert [d["id"] for d in trace["turns"][0]["documents"]] == ["p1", "p2", "p3"]
    assert [q for call in calls[n:] for q in call["queries"]] == ["hamlet author"]  # the real retriever

    # usage: the engine's own token counts for this request's turns
    rid = trace["request_id"]
    turns = [engine.results[f"answer-{rid}/t{i}"] for i in range(len(trace["turns"]))]
    generated = sum(len(r.token_ids) for r in turns)
    assert resp.usage is not None
    assert resp.usage.completion_tokens == generated
    prompt = len(prompt_ids(tok, QUESTION))
    assert resp.usage.prompt_tokens > prompt  # the prompt, plus the search results put between turns
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + generated

    # the same agent loop as /answer: the same greedy turns
    answer = httpx.post(f"{url}/answer", json={"question": QUESTION}, timeout=60).json()
    assert [t["text"] for t in answer["turns"]] == [t["text"] for t in trace["turns"]]


def test_openai_client_streams_the_turns_then_the_answer(agent: Any) -> None:
    url, model, *_ = agent
    stream = client(url).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)  # the client stops at data: [DONE]
    assert chunks and {ch.object for ch in chunks} == {"chat.completion.chunk"}
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == "William Shakespeare"
    turns = [ch.llds["turn"] for ch in chunks if "turn" in (getattr(ch, "llds", None) or {})]
    assert [t["search_query"] for t in turns] == ["hamlet author", None]
    finished = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert [ch.choices[0].finish_reason for ch in finished] == ["stop"]
    assert finished[0].llds["trace"]["turns"] == turns  # type: ignore[attr-defined]
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    )


def test_openai_client_sees_the_token_cap_and_openai_errors(agent: Any) -> None:
    url, model, *_ = agent
    c = client(url)
    msgs = [{"role": "user", "content": QUESTION}]
    capped = c.chat.completions.create(model=model, messages=msgs, max_completion_tokens=3)  # type: ignore[arg-type]
    assert capped.choices[0].finish_reason == "length" and capped.choices[0].message.content == ""
    assert capped.usage is not None and capped.usage.completion_tokens == 3

    with pytest.raises(openai.AuthenticationError):
        client(url, key="wrong").chat.completions.create(model=model, messages=msgs)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="gpt-4o", messages=msgs)  # type: ignore[arg-type]
    assert nf.value.code == "model_not_found" and model in nf.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=model, messages=msgs, n=2)  # type: ignore[arg-type]
    assert (bad.value.param, bad.value.code) == ("n", "unsupported_parameter")
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(
            model=model, messages=msgs,  # type: ignore[arg-type]
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        )  # fmt: skip
    assert bad.value.param == "tools" and "/v1" in bad.value.message


def test_retriever_down_is_503_and_an_error_event_mid_stream(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    settings = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "retriever_url": f"http://127.0.0.1:{free_port()}",
                   "train": False, "engine": {"type": "transformers"}, "retriever_retries": 1,
                   "retriever_backoff_s": 0.01, "answer_max_turns": 1, "max_tokens_per_turn": 24}
    )  # fmt: skip
    engine = TestEngine(str(tiny_model_dir), script=_search_then_answer_script(tok, "hamlet", "x"))
    app = create_app(settings, engine)
    with BackgroundServer(app) as srv:
        _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, what="model load")
        c = client(srv.url)
        model = str(tiny_model_dir)
        msgs = [{"role": "user", "content": QUESTION}]
        with pytest.raises(openai.InternalServerError) as down:
            c.chat.completions.create(model=model, messages=msgs)  # type: ignore[arg-type]
        assert down.value.status_code == 503 and "retriever unavailable" in down.value.message
        with pytest.raises(openai.APIError) as mid:
            list(c.chat.completions.create(model=model, messages=msgs, stream=True))  # type: ignore[arg-type]
        assert "retriever unavailable" in mid.value.message
        assert app.state.service.answer_admission.in_flight == 0
