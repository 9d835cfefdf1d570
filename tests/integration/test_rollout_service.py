"""The rollout service over real HTTP and a real Redis, with a real loopback retriever and the tiny model.

The tiny model is random, so where a test needs the agent to search or answer, a wrapper adds a large
bias to chosen tokens at chosen absolute positions (the engine, KV cache and sampling stay real).
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch
from fastapi import FastAPI
from reliability_kit import ForcedModel
from safetensors.torch import save_file

from llds_proto.codec import decode_group
from llds_proto.messages import TrainerInfo
from llds_proto.search_protocol import invalid_action_ids, observation_ids, prompt_ids
from llds_proto.streams import DEFAULT_KEYS, DEFAULT_RUN_ID, RunKeys
from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings
from llds_rollout.engine.base import GenerationRequest, GenerationResult
from llds_rollout.engine.hf import TransformersEngine
from llds_rollout.weights import write_marker
from llds_server.http import BackgroundServer, free_port

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUESTION = "who wrote hamlet"
PASSAGES = [
    {"id": "p1", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare around 1600.'},
    {"id": "p2", "contents": '"Macbeth"\nMacbeth is a tragedy by William Shakespeare.'},
    {"id": "p3", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "p4", "contents": '"Danube"\nThe Danube flows through Vienna.'},
]


def retriever_app(calls: list[dict[str, Any]]) -> FastAPI:
    """A real /retrieve in Search-R1's wire format: word-overlap ranking over a few passages."""
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(body)
        out = []
        for q in body["queries"]:
            words = set(q.lower().split())
            ranked = sorted(
                PASSAGES, key=lambda p: (-len(words & set(p["contents"].lower().split())), p["id"])
            )
            out.append([{"document": p, "score": 1.0} for p in ranked[: body.get("topk", 3)]])
        return {"result": out}

    return app


class TestEngine(TransformersEngine):
    """The real transformers engine; records every result by request id, optionally forces tokens,
    and can hold its model load until released (to observe /health while starting)."""

    __test__ = False

    def __init__(self, model: str, script: dict[int, int] | None = None, hold: threading.Event | None = None):
        super().__init__(model, max_batch_size=8)
        self.script, self.hold = script, hold
        self.results: dict[str, GenerationResult] = {}

    def start(self) -> None:
        if self.hold is not None:
            assert self.hold.wait(60)
        super().start()
        if self.script:
            self.model = ForcedModel(self.model, self.script)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        res = await super().generate(request)
        self.results[request.request_id] = res
        return res


def _search_then_answer_script(
    tok: Any, query: str, answer: str, search_turn_prefix: str = ""
) -> dict[int, int]:
    """Positions -> tokens so that turn 1 searches ``query`` and turn 2 answers (the retriever is
    deterministic, so the observation's length is known in advance)."""
    prompt = prompt_ids(tok, QUESTION)
    search = tok.encode(f"{search_turn_prefix}<search> {query} </search>", add_special_tokens=False)
    words = set(query.lower().split())
    docs = sorted(PASSAGES, key=lambda p: (-len(words & set(p["contents"].lower().split())), p["id"]))[:3]
    obs = observation_ids(tok, docs)
    ans = tok.encode(f"<answer> {answer} </answer>", add_special_tokens=False)
    script = {len(prompt) + i: t for i, t in enumerate(search)}
    start = len(prompt) + len(search) + len(obs)
    script.update({start + i: t for i, t in enumerate(ans)})
    return script


def _wait(cond: Any, timeout_s: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _publish(root: Path, model_dir: Path, version: int, noise: float = 0.02) -> Path:
    """What the trainer does: a safetensors folder, then the COMPLETE marker last."""
    from transformers import AutoModelForCausalLM

    folder = root / f"v{version:06d}"
    folder.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(version)
    sd = {
        k: (v + noise * torch.randn_like(v)).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(sd, str(folder / "model.safetensors"))
    shutil.copy(model_dir / "config.json", folder / "config.json")
    write_marker(folder, version, step=version * 10)
    return folder


def write_trainer_info(r: redis.Redis, keys: RunKeys = DEFAULT_KEYS, **kw: Any) -> None:
    """What the trainer writes on start: here, a pace that never holds a single replica back."""
    fields: dict[str, Any] = {"run_id": keys.run_id, "version": 0, "step": 0, "groups_per_step": 4,
                              "publish_every": 1, "staleness_k": 1, **kw}  # fmt: skip
    r.set(keys.trainer_info, TrainerInfo(**fields).model_dump_json())


@pytest.fixture(scope="module")
def retriever() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []
    with BackgroundServer(retriever_app(calls)) as srv:
        yield srv.url, calls


@pytest.fixture(scope="module")
def answer_service(
    tiny_model_dir: Path, retriever: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    root = tmp_path_factory.mktemp("weights")
    settings = RolloutSettings.load(
        overrides={
            "model": str(tiny_model_dir),
            "retriever_url": retriever[0],
            "train": False,
            "weights_root": root,
            "admin_token": TOKEN,
            "answer_max_turns": 2,
            "max_tokens_per_turn": 40,
        }
    )
    engine = TestEngine(
        str(tiny_model_dir), script=_search_then_answer_script(tok, "hamlet author", "William Shakespeare")
    )
    with BackgroundServer(create_app(settings, engine)) as srv:
        _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, what="model load")
        yield srv.url, root, engine, tok


def test_answer_searches_the_real_retriever(answer_service: Any, retriever: Any) -> None:
    url, _, engine, _ = answer_service
    calls = retriever[1]
    n = len(calls)
    r = httpx.post(f"{url}/answer", json={"question": QUESTION}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "William Shakespeare"
    assert body["turns"][0]["search_query"] == "hamlet author"
    assert [d["id"] for d in body["turns"][0]["documents"]] == ["p1", "p2", "p3"]
    assert body["turns"][0]["text"].endswith("<search> hamlet author </search>")
    assert body["turns"][1]["text"].endswith("<answer> William Shakespeare </answer>")
    assert body["weights_version"] == engine.version and body["latency_s"] > 0
    assert calls[n:] == [
        {
            "queries": ["hamlet author"],
            "topk": 3,
            "return_scores": True,
            "request_id": calls[n]["request_id"],
            "schema_version": 1,
        }
    ]
    # greedy: the same question gives the same tokens
    again = httpx.post(f"{url}/answer", json={"question": QUESTION, "max_turns": 1}, timeout=60).json()
    assert again["turns"][0]["text"] == body["turns"][0]["text"]


def test_answer_stream_sends_turns_then_the_answer(answer_service: Any) -> None:
    url = answer_service[0]
    events = []
    with httpx.stream("POST", f"{url}/answer/stream", json={"question": QUESTION}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for block in r.read().decode().split("\n\n"):
            if block.strip():
                kind, data = block.split("\n", 1)
                events.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    assert [k for k, _ in events] == ["turn", "turn", "done"]
    assert events[0][1]["search_query"] == "hamlet author"
    assert events[2][1]["answer"] == "William Shakespeare"
    assert events[2][1]["turns"] == [events[0][1], events[1][1]]
    assert httpx.post(f"{url}/answer/stream", json={"question": ""}).status_code == 422


@pytest.mark.parametrize(
    "payload", [{}, {"question": ""}, {"question": "   "}, {"question": "q", "max_turns": 0}]
)
def test_answer_rejects_bad_requests(answer_service: Any, payload: dict[str, Any]) -> None:
    r = httpx.post(f"{answer_service[0]}/answer", json=payload)
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"]


def test_metrics_and_health(answer_service: Any) -> None:
    url = answer_service[0]
    h = httpx.get(f"{url}/health").json()
    assert h["status"] == "ok" and h["service"] == "rollout" and "weights_version" in h["detail"]
    text = httpx.get(f"{url}/metrics").text
    for name in (
        "llds_rollout_generated_tokens_total",
        "llds_rollout_weights_version",
        "llds_rollout_retriever_latency_seconds_bucket",
        "llds_rollout_turns_per_trajectory_bucket",
        "llds_rollout_stale_groups_dropped_total",
    ):
        assert name in text


def test_admin_routes_need_the_token(answer_service: Any) -> None:
    url = answer_service[0]
    notice = {"version": 99, "path": "v000099"}
    assert httpx.post(f"{url}/admin/weights", json=notice).status_code == 401
    assert (
        httpx.post(f"{url}/admin/weights", json=notice, headers={"Authorization": "Bearer nope"}).status_code
        == 401
    )
    assert httpx.post(f"{url}/admin/pause").status_code == 401
    # this replica does not produce training data
    assert httpx.post(f"{url}/admin/pause", headers=AUTH).status_code == 409


def test_weight_update_accepts_good_and_rejects_bad_folders(
    answer_service: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    url, root, engine, _ = answer_service
    v = engine.version + 1
    good = _publish(root, tiny_model_dir, v)
    before = httpx.post(f"{url}/answer", json={"question": QUESTION, "max_turns": 1}, timeout=60).json()

    r = httpx.post(
        f"{url}/admin/weights", json={"version": v, "path": good.name, "step": 10}, headers=AUTH, timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.json()["version"] == v and r.json()["load_s"] > 0
    assert httpx.get(f"{url}/health").json()["detail"]["weights_version"] == v
    after = httpx.post(f"{url}/answer", json={"question": QUESTION, "max_turns": 1}, timeout=60).json()
    assert after["weights_version"] == v and before["weights_version"] == v - 1

    # corrupt: a byte flipped after the marker was written
    corrupt = _publish(root, tiny_model_dir, v + 1)
    data = bytearray((corrupt / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (corrupt / "model.safetensors").write_bytes(bytes(data))
    # incomplete: no marker yet
    incomplete = _publish(root, tiny_model_dir, v + 2)
    (incomplete / "COMPLETE").unlink()
    # symlink escape: a folder inside the root pointing outside it
    outside = _publish(tmp_path, tiny_model_dir, v + 3)
    (root / "v-link").symlink_to(outside, target_is_directory=True)
    cases = [
        ({"version": v + 1, "path": corrupt.name}, "sha256"),
        ({"version": v + 2, "path": incomplete.name}, "no COMPLETE marker"),
        ({"version": v + 3, "path": f"../{tmp_path.name}/{outside.name}"}, "weights root"),
        ({"version": v + 3, "path": str(outside)}, "relative"),
        ({"version": v + 3, "path": "v-link"}, "outside the weights root"),
        ({"version": v, "path": good.name}, "not newer"),
    ]
    for notice, why in cases:
        r = httpx.post(f"{url}/admin/weights", json=notice, headers=AUTH, timeout=60)
        assert r.status_code == 400, (notice, r.text)
        assert why in r.json()["detail"], r.text
    # the old weights keep serving, and give the same greedy tokens as before the rejects
    assert httpx.get(f"{url}/health").json()["detail"]["weights_version"] == v
    again = httpx.post(f"{url}/answer", json={"question": QUESTION, "max_turns": 1}, timeout=60).json()
    assert again["weights_version"] == v and again["turns"] == after["turns"]


def test_answer_503_when_retriever_is_down(tiny_model_dir: Path) -> None:
    settings = RolloutSettings.load(
        overrides={
            "model": str(tiny_model_dir),
            "retriever_url": f"http://127.0.0.1:{free_port()}",
            "train": False,
            "retriever_retries": 1,
            "retriever_backoff_s": 0.01,
            "answer_max_turns": 1,
            "max_tokens_per_turn": 24,
        }
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    hold = threading.Event()
    engine = TestEngine(str(tiny_model_dir), script=_search_then_answer_script(tok, "hamlet", "x"), hold=hold)
    with BackgroundServer(create_app(settings, engine)) as srv:
        r = httpx.get(f"{srv.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        assert httpx.post(f"{srv.url}/answer", json={"question": QUESTION}).status_code == 503
        hold.set()
        _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, what="model load")
        r = httpx.post(f"{srv.url}/answer", json={"question": QUESTION}, timeout=60)
        assert r.status_code == 503
        assert "retriever unavailable" in r.json()["detail"] and "2 attempts" in r.json()["detail"]
        assert "ConnectError" in httpx.get(f"{srv.url}/metrics").text


def test_admin_disabled_without_a_configured_token(
    tiny_model_dir: Path, retriever: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLDS_ADMIN_TOKEN", raising=False)
    settings = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "retriever_url": retriever[0], "train": False}
    )
    hold = threading.Event()  # never released: admin auth is checked before anything needs the model
    with BackgroundServer(create_app(settings, TestEngine(str(tiny_model_dir), hold=hold))) as srv:
        r = httpx.post(f"{srv.url}/admin/weights", json={"version": 1, "path": "v000001"}, headers=AUTH)
        assert r.status_code == 403 and "admin disabled" in r.json()["detail"]
        hold.set()


def test_training_groups_reach_redis_with_exact_tokens_and_respect_staleness(
    tiny_model_dir: Path, retriever: Any, redis_url: str, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"id": "q0", "data_source": "world", "question": QUESTION,
                                   "golden_answers": ["William Shakespeare"], "extra_info": {"index": 0}}) + "\n")  # fmt: skip
    root = tmp_path / "weights"
    root.mkdir()
    port = free_port()
    settings = RolloutSettings.load(
        overrides={
            "model": str(tiny_model_dir),
            "retriever_url": retriever[0],
            "redis_url": redis_url,
            "dataset": dataset,
            "weights_root": root,
            "admin_token": TOKEN,
            "group_size": 3,
            "max_turns": 1,
            "max_tokens_per_turn": 24,
            "max_groups_in_flight": 2,
            "max_staleness": 1,
            "version_poll_s": 0.05,
            "replica_name": "r0",
            "port": port,
            # this test sends the notice itself, late on purpose: no catch-up in between
            "catch_up_after_s": 600,
        }
    )
    # turn 1 is forced to search; the final (no-search) turn is sampled freely at temperature 1
    script = _search_then_answer_script(
        tok, "hamlet author", "William Shakespeare", "<think> look it up </think>"
    )
    n_search = len(
        tok.encode("<think> look it up </think><search> hamlet author </search>", add_special_tokens=False)
    )
    script = {p: t for p, t in script.items() if p < len(prompt_ids(tok, QUESTION)) + n_search}
    engine = TestEngine(str(tiny_model_dir), script=script)
    r = redis.Redis.from_url(redis_url)
    write_trainer_info(r)
    with BackgroundServer(create_app(settings, engine), port=port) as srv:
        _wait(lambda: r.xlen(DEFAULT_KEYS.stream) >= 2, what="two groups on the stream")
        assert r.hget(DEFAULT_KEYS.registry, "r0") == srv.url.encode()
        groups = [decode_group(f[b"group"]) for _, f in r.xrange(DEFAULT_KEYS.stream)]
        obs = observation_ids(tok, [p for p in PASSAGES if p["id"] in ("p1", "p2", "p3")])
        for g in groups:
            assert g.group_id.startswith("world:0:") and g.producer == "r0" and len(g.trajectories) == 3
            assert g.run_id == DEFAULT_RUN_ID
            for t in g.trajectories:
                gen1 = engine.results[f"{t.trajectory_id}/t0"]
                gen2 = engine.results[f"{t.trajectory_id}/t1"]
                # exactly the engine's sampled tokens plus the observation tokens, nothing re-tokenized
                assert t.prompt_ids == prompt_ids(tok, QUESTION)
                assert t.response_ids == gen1.token_ids + obs + gen2.token_ids
                assert t.logprobs == pytest.approx(gen1.logprobs + [0.0] * len(obs) + gen2.logprobs)
                assert t.loss_mask == [1] * len(gen1.token_ids) + [0] * len(obs) + [1] * len(gen2.token_ids)
                assert set(t.versions) == {0, -1} and t.num_valid_searches == 1 and t.num_turns == 2
                assert t.action_spans == [
                    (0, len(gen1.token_ids)),
                    (len(gen1.token_ids) + len(obs), len(t.response_ids)),
                ]
                assert t.response_ids[: len(gen1.token_ids)] != invalid_action_ids(tok)[: len(gen1.token_ids)]

        # the trainer moves 3 versions ahead: in-flight groups are dropped, no new group starts
        r.set(DEFAULT_KEYS.trainer_version, 3)
        _wait(lambda: "llds_rollout_stale_groups_dropped_total 0.0" not in httpx.get(f"{srv.url}/metrics").text,
              what="a stale drop")  # fmt: skip
        time.sleep(0.5)
        frozen = r.xlen(DEFAULT_KEYS.stream)
        time.sleep(1.0)
        assert r.xlen(DEFAULT_KEYS.stream) == frozen
        assert httpx.get(f"{srv.url}/health").json()["detail"]["trainer_version"] == 3

        # the trainer publishes v3 and notifies: production resumes on it
        folder = _publish(root, tiny_model_dir, 3)
        resp = httpx.post(
            f"{srv.url}/admin/weights", json={"version": 3, "path": folder.name}, headers=AUTH, timeout=60
        )
        assert resp.status_code == 200, resp.text
        _wait(lambda: r.xlen(DEFAULT_KEYS.stream) > frozen, what="groups on the new weights")
        _, fields = r.xrange(DEFAULT_KEYS.stream)[frozen]
        g = decode_group(fields[b"group"])
        assert g.min_version == 3 and {v for t in g.trajectories for v in t.versions} == {3, -1}
    # deregistered on shutdown
    assert r.hget(DEFAULT_KEYS.registry, "r0") is None


def test_a_replica_that_starts_late_catches_up_and_produces(
    tiny_model_dir: Path, retriever: Any, redis_url: str, tmp_path: Path
) -> None:
    """The trainer published v2 before this replica started, and will send no notice: the replica
    loads v2 from the weights root at registration and samples on it (its own run's keys only)."""
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"id": "q0", "data_source": "world", "question": QUESTION,
                                   "golden_answers": ["x"], "extra_info": {"index": 0}}) + "\n")  # fmt: skip
    root = tmp_path / "weights"
    keys = RunKeys("late-run")
    _publish(root, tiny_model_dir, 2)
    r = redis.Redis.from_url(redis_url)
    r.set(keys.trainer_version, 2)
    write_trainer_info(r, keys, version=2, step=2)
    r.set(DEFAULT_KEYS.trainer_version, 7)  # another run's version: must not matter
    settings = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "retriever_url": retriever[0], "redis_url": redis_url,
                   "run_id": keys.run_id, "dataset": dataset, "weights_root": root, "group_size": 2,
                   "max_turns": 0, "max_tokens_per_turn": 8, "max_groups_in_flight": 1, "version_poll_s": 0.05,
                   "replica_name": "late", "port": free_port()}
    )  # fmt: skip
    with BackgroundServer(create_app(settings, TestEngine(str(tiny_model_dir))), port=settings.port) as srv:
        _wait(lambda: r.xlen(keys.stream) >= 1, what="a group of the late replica")
        assert httpx.get(f"{srv.url}/health").json()["detail"]["weights_version"] == 2
        g = decode_group(r.xrange(keys.stream)[0][1][b"group"])
        assert g.min_version == 2 and g.run_id == "late-run"
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert 'llds_rollout_weight_catch_ups_total{status="ok"} 1.0' in metrics
        assert r.hget(keys.registry, "late") == srv.url.encode() and r.hexists(keys.in_flight, "late")
    assert r.xlen(DEFAULT_KEYS.stream) == 0
    assert not r.hexists(keys.in_flight, "late")  # removed on shutdown


def _rewrite_in_place(path: Path) -> None:
    """Flip the last byte of ``path`` in place (same size, same inode): what a sha256 check done
    before cannot see."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(bytes(data))


def test_a_folder_changed_under_the_swap_stops_serving_until_a_whole_version_loads(
    tiny_model_dir: Path,
    retriever: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 30: the replica pins the folder it reads (the trainer's clean-up keeps it); a folder
    rewritten after its checks and before the engine is done with it fails the engine: /answer stops
    (503 naming why), /health says degraded, until a whole version loads, which heals it (production
    waiting meanwhile: test_rollout_scheduler.py::test_a_failed_engine_starts_no_group_...)."""
    from llds_rollout.faults import SWAP_DELAY_ENV

    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"id": "q0", "data_source": "world", "question": QUESTION,
                                   "golden_answers": ["x"], "extra_info": {"index": 0}}) + "\n")  # fmt: skip
    root = tmp_path / "weights"
    root.mkdir()
    keys = RunKeys("swap-run")
    r = redis.Redis.from_url(redis_url)
    write_trainer_info(r, keys, version=0, step=0)
    settings = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "retriever_url": retriever[0], "redis_url": redis_url,
                   "run_id": keys.run_id, "dataset": dataset, "weights_root": root, "group_size": 2,
                   "max_turns": 0, "max_tokens_per_turn": 8, "max_groups_in_flight": 1, "version_poll_s": 0.05,
                   "replica_name": "swapper", "port": free_port(), "admin_token": TOKEN,
                   "catch_up_after_s": 3600}
    )  # fmt: skip
    with BackgroundServer(create_app(settings, TestEngine(str(tiny_model_dir))), port=settings.port) as srv:
        _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, what="model load")
        _wait(lambda: r.xlen(keys.stream) >= 1, what="a group on version 0")
        v1 = _publish(root, tiny_model_dir, 1)
        monkeypatch.setenv(SWAP_DELAY_ENV, "2")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            swap = pool.submit(
                httpx.post, f"{srv.url}/admin/weights", json={"version": 1, "path": v1.name}, headers=AUTH,
                timeout=60,
            )  # fmt: skip
            _wait(lambda: r.zscore(keys.weight_pins, "1/swapper") is not None, 10, "the pin of v1")
            # after the checks passed (a change before them is a plain rejection, a 400)
            _wait(lambda: "fault injection: the checked folder is read" in caplog.text, 30, "the checks")
            _rewrite_in_place(v1 / "model.safetensors")
            failed = swap.result()
        monkeypatch.delenv(SWAP_DELAY_ENV)
        assert failed.status_code == 502, failed.text
        assert "files of version 1 changed while it loaded" in failed.json()["detail"]
        assert r.zscore(keys.weight_pins, "1/swapper") is None  # unpinned when done
        health = httpx.get(f"{srv.url}/health").json()
        assert health["status"] == "degraded" and "serving nothing" in health["detail"]["error"], health
        answer = httpx.post(f"{srv.url}/answer", json={"question": QUESTION, "max_turns": 1}, timeout=60)
        assert answer.status_code == 503 and "changed while it loaded" in answer.json()["detail"], answer.text
        assert "llds_rollout_weight_swap_failures_total 1.0" in httpx.get(f"{srv.url}/metrics").text
        v2 = _publish(root, tiny_model_dir, 2)
        healed = httpx.post(f"{srv.url}/admin/weights", json={"version": 2, "path": v2.name}, headers=AUTH,
                            timeout=60)  # fmt: skip
        assert healed.status_code == 200 and healed.json()["version"] == 2, healed.text
        assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
        after = httpx.post(f"{srv.url}/answer", json={"question": QUESTION, "max_turns": 1}, timeout=60)
        assert after.status_code == 200 and after.json()["weights_version"] == 2
        r.set(keys.trainer_version, 2)
        write_trainer_info(r, keys, version=2, step=2)
        _wait(
            lambda: decode_group(r.xrange(keys.stream)[-1][1][b"group"]).min_version == 2, what="a v2 group"
        )
    # No group carries the version that never loaded whole.
    assert {decode_group(f[b"group"]).min_version for _, f in r.xrange(keys.stream)} == {0, 2}


def test_a_restarted_rollout_goes_on_with_the_runs_data_order(
    tiny_model_dir: Path, retriever: Any, redis_url: str, tmp_path: Path
) -> None:
    """Issue 30: one data order per run, in Redis. A rollout stopped and another started on the same run
    (a restart, or a replica replaced under a new name) goes on from the run's cursor, not from the
    first prompt: no position reaches the stream twice, and every position below the cursor is in the
    stream or given back (claimed again first by the next replica). Witnessed from the stream's group
    ids and the Redis keys, on the real service."""
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{i}", "data_source": "world", "question": QUESTION,
                                           "golden_answers": ["x"]}) + "\n" for i in range(5)))  # fmt: skip
    keys = RunKeys("order-run")
    r = redis.Redis.from_url(redis_url)
    r.delete(keys.stream, keys.data_cursor, keys.data_claims, keys.data_dropped)
    write_trainer_info(r, keys, version=0, step=0, groups_per_step=8)

    def positions() -> list[int]:
        return [int(decode_group(f[b"group"]).group_id.rsplit(":p", 1)[1]) for _, f in r.xrange(keys.stream)]

    def serve(name: str, want: int) -> None:
        settings = RolloutSettings.load(
            overrides={"model": str(tiny_model_dir), "retriever_url": retriever[0], "redis_url": redis_url,
                       "run_id": keys.run_id, "dataset": dataset, "group_size": 2, "max_turns": 0,
                       "max_tokens_per_turn": 4, "max_groups_in_flight": 2, "version_poll_s": 0.05,
                       "replica_name": name, "port": free_port(), "admin_token": TOKEN, "seed": 3}
        )  # fmt: skip
        with BackgroundServer(create_app(settings, TestEngine(str(tiny_model_dir))), port=settings.port):
            _wait(lambda: r.xlen(keys.stream) >= want, 120, f"{want} groups")

    serve("first", 3)
    first = positions()
    cursor = int(r.get(keys.data_cursor))
    given_back = sorted(int(k) for k in r.hkeys(keys.data_claims))
    assert all(v.startswith(b"released\t") for v in r.hvals(keys.data_claims))  # a graceful stop gives back
    assert sorted(first + given_back) == list(range(cursor))

    serve("second", len(first) + 3)
    got = positions()
    assert len(got) == len(set(got)), got  # no position twice
    later = got[len(first) :]
    assert set(later) <= set(given_back) | set(range(cursor, cursor + 100)), (first, given_back, later)
    assert set(given_back) <= set(later) | {int(k) for k in r.hkeys(keys.data_claims)}
    # the order is the run's: position p is row perm(epoch)[p % 5] of the seeded order, whoever samples it
    from llds_rollout.dataset import DataOrder, load_rows

    order = DataOrder(load_rows(dataset), shuffle=True, seed=3)
    for _, f in r.xrange(keys.stream):
        g = decode_group(f[b"group"])
        row, epoch = order.at(int(g.group_id.rsplit(":p", 1)[1]))
        assert g.prompt_id == row.prompt_id and g.group_id.startswith(f"{row.prompt_id}:{epoch}:p")
