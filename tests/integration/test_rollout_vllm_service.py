"""The rollout service on the vLLM engine, over HTTP: vLLM's OpenAI-compatible ``/v1`` routes on our
port (and none of vLLM's dev routes), ``/answer`` and a live weight swap with ``/v1`` requests in flight.

Needs vLLM: ``make test`` runs this file in ``.venv-vllm`` (make test-vllm); the main environment
skips it. One engine start (~1 min) serves the whole module.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_rollout_service import AUTH, TOKEN, _publish, _wait, retriever_app

from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings
from llds_server.http import BackgroundServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]

SERVED = "llds-tiny"
APP: dict[str, Any] = {}
"""The module's rollout service object (its settings and admission are swapped in some tests)."""


@pytest.fixture(scope="module")
def service(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path, list]]:
    calls: list[dict[str, Any]] = []
    root = tmp_path_factory.mktemp("weights")
    with BackgroundServer(retriever_app(calls)) as retriever:
        settings = RolloutSettings.load(
            overrides={
                "model": str(tiny_model_dir),
                "retriever_url": retriever.url,
                "train": False,
                "weights_root": root,
                "admin_token": TOKEN,
                "answer_max_turns": 1,
                "max_tokens_per_turn": 24,
                "engine": {
                    "type": "vllm",
                    "max_batch_size": 8,
                    "max_model_len": 1024,
                    "served_model_name": SERVED,
                },
            }
        )
        app = create_app(settings)
        APP["service"] = app.state.service
        with BackgroundServer(app) as srv:
            _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, 300.0, "vLLM engine load")
            yield srv.url, root, calls, retriever.url


def test_v1_models_and_completions(service: Any) -> None:
    url = service[0]
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [SERVED]

    body = {"model": SERVED, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    a = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
    b = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]  # greedy: deterministic
    assert a["usage"]["completion_tokens"] == 8

    chat = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "who wrote hamlet?"}],
        "max_completion_tokens": 6,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert r.json()["usage"]["completion_tokens"] <= 6


def test_metrics_serve_ours_and_vllms(service: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    url = service[0]
    body = {"model": SERVED, "prompt": "metrics", "max_tokens": 4}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200
    text = httpx.get(f"{url}/metrics", timeout=30).text
    names = [f.name for f in text_string_to_metric_families(text)]  # parses: valid exposition
    assert len(names) == len(set(names)), "a metric family appears twice"
    assert "llds_rollout_weights_version" in names
    assert any(n.startswith("vllm:generation_tokens") for n in names), [n for n in names if "vllm" in n]
    assert "vllm:num_requests_running" in names


def test_v1_chat_streams_server_sent_events(service: Any) -> None:
    url = service[0]
    chat = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "count to five"}],
        "max_completion_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=chat, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks) and len(chunks) >= 2


def test_v1_bad_requests_get_vllm_4xx(service: Any) -> None:
    url = service[0]
    r = httpx.post(
        f"{url}/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2}, timeout=30
    )
    assert r.status_code == 404 and "nope" in r.text
    r = httpx.post(
        f"{url}/v1/completions", json={"model": SERVED, "prompt": "x", "max_tokens": -1}, timeout=30
    )
    assert 400 <= r.status_code < 500


@pytest.mark.parametrize(
    "path",
    ["/pause", "/resume", "/is_paused", "/collective_rpc", "/reset_prefix_cache", "/sleep", "/wake_up",
     "/tokenize", "/version", "/invocations", "/ping", "/update_weights", "/init_weight_transfer_engine",
     "/v1/load_lora_adapter", "/v1/unload_lora_adapter"],
)  # fmt: skip
def test_vllm_dev_and_control_routes_are_not_exposed(service: Any, path: str) -> None:
    url = service[0]
    assert httpx.post(f"{url}{path}", json={}, timeout=30).status_code in (404, 405)
    assert httpx.get(f"{url}{path}", timeout=30).status_code in (404, 405)


def test_answer_runs_on_vllm(service: Any) -> None:
    url = service[0]
    r = httpx.post(f"{url}/answer", json={"question": "who wrote hamlet?", "max_turns": 1}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["weights_version"] >= 0 and r.json()["turns"]


def test_swap_keeps_v1_requests_in_flight(service: Any, tiny_model_dir: Path) -> None:
    url, root = service[:2]
    version = httpx.get(f"{url}/health").json()["detail"]["weights_version"] + 1
    folder = _publish(root, tiny_model_dir, version)
    body = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": True}

    def complete() -> tuple[httpx.Response, float]:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
        return r, time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        long = [pool.submit(complete) for _ in range(6)]
        time.sleep(0.5)  # the long requests are decoding when the swap starts
        swap = httpx.post(
            f"{url}/admin/weights", json={"version": version, "path": folder.name}, headers=AUTH, timeout=300
        )
        swapped_at = time.monotonic()
        done = [f.result() for f in long]
    assert swap.status_code == 200, swap.text
    results = [r for r, _ in done]
    assert any(t > swapped_at for _, t in done), "no request was in flight across the swap"
    assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
    assert all(r.json()["usage"]["completion_tokens"] == 600 for r in results)
    assert httpx.get(f"{url}/health").json()["detail"]["weights_version"] == version
    after = httpx.post(
        f"{url}/answer", json={"question": "who wrote hamlet?", "max_turns": 1}, timeout=120
    ).json()
    assert after["weights_version"] == version


def test_llds_answer_in_process_on_vllm(
    tiny_model_dir: Path, service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llds answer --model DIR "question"``: the command-line inference, on the default backend."""
    from llds_rollout.cli import answer_main

    retriever_url = service[3]
    code = answer_main(["--model", str(tiny_model_dir), "--retriever-url", retriever_url, "--max-turns", "1",
                        "--json", "who wrote hamlet"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert '"weights_version": 0' in out and '"turns"' in out


def test_v1_sends_no_cors_headers(service: Any) -> None:
    """vLLM allows every origin by default; ours allows none: a page in a browser on the host cannot
    read /v1 answers (nor send a preflighted request)."""
    url = service[0]
    origin = {"Origin": "http://evil.example"}
    r = httpx.get(f"{url}/v1/models", headers=origin, timeout=30)
    assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers), r.headers
    pre = httpx.options(f"{url}/v1/completions", timeout=30,
                        headers={**origin, "Access-Control-Request-Method": "POST",
                                 "Access-Control-Request-Headers": "content-type"})  # fmt: skip
    assert "access-control-allow-origin" not in pre.headers, pre.headers


def test_v1_needs_the_api_key_when_one_is_set_and_beyond_loopback(service: Any) -> None:
    url, svc = service[0], APP["service"]
    body = {"model": SERVED, "prompt": "key", "max_tokens": 2}
    before = svc.settings
    try:
        svc.settings = before.model_copy(update={"api_key": "k-123"})
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 401 and "API key" in r.json()["detail"], r.text
        r = httpx.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}, timeout=60
        )
        assert r.status_code == 401
        r = httpx.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer k-123"}, timeout=60
        )
        assert r.status_code == 200, r.text
        # bound beyond loopback with no key: /v1 is off, and says which setting turns it on
        svc.settings = before.model_copy(update={"api_key": None, "host": "0.0.0.0"})
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 403 and "api_key" in r.json()["detail"], r.text
    finally:
        svc.settings = before
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200  # loopback, no key


def test_v1_shares_the_answer_slots_and_sheds_load_with_503(service: Any) -> None:
    """With one running slot and none queued, concurrent /v1 requests beyond the first get 503 with
    Retry-After (counted as rejected answers) while the first completes."""
    from llds_rollout.answer_admission import AnswerAdmission

    url, svc = service[0], APP["service"]
    before = svc.answer_admission
    svc.answer_admission = AnswerAdmission(max_in_flight=1, max_queued=0, retry_after_s=2.0)
    body = {
        "model": SERVED,
        "prompt": "Once upon a time",
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            rs = list(
                pool.map(lambda _: httpx.post(f"{url}/v1/completions", json=body, timeout=120), range(6))
            )
    finally:
        svc.answer_admission = before
    codes = sorted(r.status_code for r in rs)
    assert codes.count(200) >= 1 and codes.count(503) >= 1, codes
    busy = next(r for r in rs if r.status_code == 503)
    assert busy.headers["retry-after"] == "2" and "answer capacity full" in busy.json()["detail"]


def test_a_folder_changed_under_the_swap_fails_the_engine_until_a_whole_version_loads(
    service: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30, on vLLM (which reads the folder itself, after our checks): the folder rewritten in
    place after its sha256 check and before vLLM reads it. vLLM loads the changed bytes; the replica
    sees the files changed, answers 502, and serves nothing (/answer and /v1: 503 naming why,
    /health degraded) until a whole version loads, which heals it."""
    from llds_rollout.faults import SWAP_DELAY_ENV

    url, root = service[:2]
    version = httpx.get(f"{url}/health").json()["detail"]["weights_version"] + 1
    folder = _publish(root, tiny_model_dir, version)
    monkeypatch.setenv(SWAP_DELAY_ENV, "2")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        swap = pool.submit(httpx.post, f"{url}/admin/weights", json={"version": version, "path": folder.name},
                           headers=AUTH, timeout=300)  # fmt: skip
        time.sleep(1.0)  # checked (a few MB hashed), now waiting before vLLM reads the folder
        data = bytearray((folder / "model.safetensors").read_bytes())
        data[-64:] = bytes(b ^ 0xFF for b in data[-64:])
        with open(folder / "model.safetensors", "r+b") as f:
            f.write(bytes(data))
        failed = swap.result()
    monkeypatch.delenv(SWAP_DELAY_ENV)
    try:
        assert failed.status_code == 502, failed.text
        assert f"files of version {version} changed while it loaded" in failed.json()["detail"]
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "degraded" and "serving nothing" in health["detail"]["error"], health
        assert health["detail"]["weights_version"] == version - 1
        answer = httpx.post(
            f"{url}/answer", json={"question": "who wrote hamlet?", "max_turns": 1}, timeout=60
        )
        assert answer.status_code == 503 and "changed while it loaded" in answer.json()["detail"], answer.text
        body = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 4}
        v1 = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert v1.status_code == 503 and "changed while it loaded" in v1.json()["detail"], v1.text
    finally:
        healed_folder = _publish(root, tiny_model_dir, version + 1)
        healed = httpx.post(f"{url}/admin/weights", json={"version": version + 1, "path": healed_folder.name},
                            headers=AUTH, timeout=300)  # fmt: skip
    assert healed.status_code == 200, healed.text
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    after = httpx.post(f"{url}/answer", json={"question": "who wrote hamlet?", "max_turns": 1}, timeout=120)
    assert after.status_code == 200 and after.json()["weights_version"] == version + 1
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200


def test_agent_v1_runs_the_search_agent_beside_the_bare_v1(service: Any) -> None:
    """Through the official openai client, on the one vLLM engine: ``/agent/v1`` is the agent (the
    ``/answer`` loop, greedy, its turns in ``llds``), ``/v1`` the bare model (no ``llds``)."""
    import openai

    url = service[0]
    msgs: Any = [{"role": "user", "content": "who wrote hamlet?"}]
    agent = openai.OpenAI(base_url=f"{url}/agent/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in agent.models.list()] == [SERVED]  # the same id as /v1's
    resp = agent.chat.completions.create(model=SERVED, messages=msgs)
    trace = resp.llds  # type: ignore[attr-defined]
    answer = httpx.post(f"{url}/answer", json={"question": "who wrote hamlet?"}, timeout=120).json()
    assert [t["text"] for t in trace["turns"]] == [t["text"] for t in answer["turns"]]
    assert resp.choices[0].message.content == (trace["answer"] or "")
    assert resp.usage is not None and resp.usage.completion_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert trace["weights_version"] == httpx.get(f"{url}/health").json()["detail"]["weights_version"]

    chunks = list(agent.chat.completions.create(model=SERVED, messages=msgs, stream=True))
    final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(final) == 1 and final[0].llds["trace"]["turns"] == trace["turns"]  # type: ignore[attr-defined]

    bare = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    plain = bare.chat.completions.create(model=SERVED, messages=msgs, max_completion_tokens=6)
    assert plain.choices[0].message.role == "assistant" and "llds" not in (plain.model_extra or {})
