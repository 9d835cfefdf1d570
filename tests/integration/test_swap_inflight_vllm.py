"""Weight swaps on the vLLM engine with `/answer`, `/answer/stream`, `/v1` and training-group
production in flight at once: what the README's one-version guarantee covers, exactly as tested,
under each swap mode: ``drain``, ``inflight`` (with the KV cache recomputed) and ``abort``.

Each published version is a copy of the tiny model fine-tuned to its own search query and its own
answer (``VERSIONS``), so a greedy answer names the version of each of its turns: turn 1's query is
the version that searched, the final answer the version that answered. A training turn's tokens are
scored by the trainer under the weights of the version it records: a turn that straddled a swap
would be off by nats, not by float32 rounding.

- `/answer` and `/answer/stream`: 0 failures; every turn of a response comes from the version the
  response reports (``weights_version``; the stream's ``done`` event, its ``turn`` events equal).
- Training trajectories: every token's recorded version is the one that sampled it (log-probs equal
  the trainer's under that version); under ``drain`` it is constant within each engine call (one
  assistant turn), under ``inflight`` and ``abort`` a turn may change version once the swap reaches it; versions
  never go backwards (the design: versions are recorded per token).
- ``answer_consistency = "latest"`` (inflight): swaps do not wait for answers; an answer's
  ``weights_versions`` names every version its turns show.
- `/v1` (vLLM's OpenAI routes): requests in flight during a swap are frozen, not dropped, and finish
  on the new weights: the tokens before the swap come from the old version, those after from the
  new one. Such a response has no single version (and carries none).

Needs vLLM: ``make test`` runs this file in ``.venv-vllm`` (make test-vllm); the main environment
skips it. One engine start (~1 min).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch
from test_exactness import (
    TOLERANCES,
    admit_groups,
    runs,
    searching_model,
    trainer_config,
    write_dataset,
)
from test_rollout_service import AUTH, QUESTION, TOKEN, _wait, retriever_app

from llds_proto.codec import decode_group
from llds_proto.messages import TrajectoryGroup
from llds_proto.streams import DEFAULT_KEYS
from llds_rollout.weights import write_marker
from llds_server.http import BackgroundServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]

SERVED = "llds-tiny"
VERSIONS = [
    ("hamlet author", "William Shakespeare"),
    ("macbeth author", "Macbeth"),
    ("paris capital", "Paris"),
    ("danube vienna", "Vienna"),
]
"""Weights ``k`` search ``VERSIONS[k][0]`` and answer ``VERSIONS[k][1]``; version ``v`` serves weights
``v % 4``."""


@pytest.fixture(scope="module")
def weights(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out, base = [], tiny_model_dir
    for k, (query, answer) in enumerate(VERSIONS):
        base = searching_model(base, tmp_path_factory.mktemp(f"w{k}"), query, answer)
        out.append(base)
    return out


def publish(root: Path, weights: list[Path], version: int) -> Path:
    """What the trainer does: the weights of ``version`` in ``v{version:06d}/``, COMPLETE last."""
    import shutil

    src = weights[version % len(weights)]
    folder = root / f"v{version:06d}"
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(src / name, folder / name)
    write_marker(folder, version, step=version)
    return folder


@pytest.fixture(scope="module", params=["drain", "inflight", "abort"])
def service(
    request: pytest.FixtureRequest,
    weights: list[Path],
    redis_server: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    from llds_rollout.app import create_app
    from llds_rollout.config import RolloutSettings

    url = redis_server.url
    redis.Redis.from_url(url).flushall()
    admit_groups(url)
    tmp = tmp_path_factory.mktemp("swap")
    root = tmp / "weights"
    root.mkdir()
    with BackgroundServer(retriever_app([])) as retriever:
        settings = RolloutSettings.load(
            overrides={
                "model": str(weights[0]),
                "retriever_url": retriever.url,
                "redis_url": url,
                "dataset": write_dataset(tmp / "train.jsonl"),
                "weights_root": root,
                "admin_token": TOKEN,
                "group_size": 2,
                "max_turns": 1,
                "answer_max_turns": 1,
                "max_tokens_per_turn": 16,
                "max_groups_in_flight": 2,
                "max_staleness": 100,
                "version_poll_s": 0.05,
                "engine": {"type": "vllm", "max_batch_size": 16, "max_model_len": 1024,
                           "served_model_name": SERVED, "swap_mode": request.param,
                           "recompute_kv": request.param == "inflight"},
            }
        )  # fmt: skip
        with BackgroundServer(create_app(settings)) as srv:
            _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, 400.0, "vLLM engine load")
            yield {"url": srv.url, "root": root, "redis": url, "mode": request.param, "settings": settings}


def _version(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=30).json()["detail"]["weights_version"])


def _swap(svc: dict[str, Any], weights: list[Path]) -> int:
    v = _version(svc["url"]) + 1
    folder = publish(svc["root"], weights, v)
    r = httpx.post(f"{svc['url']}/admin/weights", json={"version": v, "path": folder.name}, headers=AUTH,
                   timeout=300)  # fmt: skip
    assert r.status_code == 200, r.text
    return v


def _complete(url: str, prompt: str | list[int], n: int) -> tuple[list[int], list[int]]:
    """Greedy ``/v1/completions``: (prompt token ids, completion token ids)."""
    body = {"model": SERVED, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert len(c["token_ids"]) == n
    return c["prompt_token_ids"], c["token_ids"]


def test_v1_request_in_flight_across_a_swap_finishes_on_the_new_weights(
    service: dict[str, Any], weights: list[Path]
) -> None:
    url, n = service["url"], 300
    prompt, old = _complete(url, "Once upon a time", n)  # what the old version alone produces
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(res=_complete(url, "Once upon a time", n)))
    t.start()
    time.sleep(1.0)  # decoding on the old weights when the swap starts
    _swap(service, weights)
    t.join(300)
    mixed = box["res"][1]
    _, new = _complete(url, "Once upon a time", n)  # what the new version alone produces
    k = next((i for i, (a, b) in enumerate(zip(mixed, old, strict=True)) if a != b), n)
    assert 0 < k < n, f"first token differing from the old version's: {k} of {n}"
    assert mixed != new
    # the rest is exactly what the new weights continue from the old version's first k tokens
    _, rest = _complete(url, prompt + mixed[:k], n - k)
    assert rest == mixed[k:]


def _read_sse(r: httpx.Response) -> list[tuple[str, Any]]:
    events = []
    for block in r.read().decode().split("\n\n"):
        if block.strip():
            kind, data = block.split("\n", 1)
            events.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_swaps_under_load_keep_every_answer_and_every_turn_on_one_version(
    service: dict[str, Any], weights: list[Path], tmp_path: Path
) -> None:
    url = service["url"]
    r = redis.Redis.from_url(service["redis"])
    first_entry = r.xlen(DEFAULT_KEYS.stream)
    stop = threading.Event()
    answers: list[httpx.Response] = []
    streams: list[tuple[int, list[tuple[str, Any]]]] = []
    v1: list[httpx.Response] = []
    errors: list[str] = []

    def loop(fn: Any) -> None:
        while not stop.is_set():
            try:
                fn()
            except Exception as e:  # a failed request is a test failure, reported below
                errors.append(f"{type(e).__name__}: {e}")

    def answer() -> None:
        answers.append(httpx.post(f"{url}/answer", json={"question": QUESTION}, timeout=300))

    def stream() -> None:
        with httpx.stream("POST", f"{url}/answer/stream", json={"question": QUESTION}, timeout=300) as resp:
            streams.append((resp.status_code, _read_sse(resp)))

    def openai() -> None:
        body = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True}
        v1.append(httpx.post(f"{url}/v1/completions", json=body, timeout=300))

    clients = [threading.Thread(target=loop, args=(f,)) for f in (answer, answer, stream, openai)]
    for c in clients:
        c.start()
    swapped = []
    try:
        for _ in range(4):
            time.sleep(2.0)
            swapped.append(_swap(service, weights))
        time.sleep(2.0)
    finally:
        stop.set()
        for c in clients:
            c.join(300)
    _wait(lambda: r.xlen(DEFAULT_KEYS.stream) > first_entry, 120.0, "a group after the swaps")

    assert not errors, errors[:3]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200][:3]
    assert all(s == 200 for s, _ in streams) and all(x.status_code == 200 for x in v1)
    seen = set()
    for body in [a.json() for a in answers] + [ev[-1][1] for _, ev in streams]:
        v = body["weights_version"]
        query, gold = VERSIONS[v % len(VERSIONS)]
        assert body["turns"][0]["search_query"] == query, (v, body)  # turn 1 by version v
        assert body["answer"] == gold, (v, body)  # the final turn by version v
        seen.add(v)
    for _, ev in streams:
        assert [k for k, _ in ev] == ["turn", "turn", "done"], ev
        assert ev[-1][1]["turns"] == [ev[0][1], ev[1][1]]
    assert len(seen) >= 3, f"answers saw versions {sorted(seen)} across swaps {swapped}"
    print(f"\n{len(answers)} /answer, {len(streams)} /answer/stream, {len(v1)} /v1 across swaps to {swapped}")

    # training groups sampled across the swaps: one version per engine call, the one that sampled it
    groups = [decode_group(f[b"group"]) for _, f in r.xrange(DEFAULT_KEYS.stream, min=_after(first_entry, r))]
    check_training_turns(groups, weights, tmp_path, one_version_per_turn=service["mode"] == "drain")


def _after(n: int, r: Any) -> str:
    """Stream id of the ``n``-th entry (0-based) onwards: this test's own groups."""
    entries = r.xrange(DEFAULT_KEYS.stream, count=n + 1)
    return entries[n][0].decode() if len(entries) > n else "-"


def test_latest_answers_do_not_hold_swaps_and_name_every_version_they_span(
    service: dict[str, Any], weights: list[Path]
) -> None:
    if service["mode"] != "inflight":
        pytest.skip("answer_consistency = latest is exercised with the inflight swap mode")
    url, settings = service["url"], service["settings"]
    settings.answer_consistency = "latest"
    stop = threading.Event()
    answers: list[httpx.Response] = []

    def loop() -> None:
        while not stop.is_set():
            answers.append(httpx.post(f"{url}/answer", json={"question": QUESTION}, timeout=300))

    clients = [threading.Thread(target=loop) for _ in range(3)]
    for c in clients:
        c.start()
    try:
        for _ in range(6):
            time.sleep(0.7)
            _swap(service, weights)
    finally:
        stop.set()
        for c in clients:
            c.join(300)
        settings.answer_consistency = "version"
    assert answers and all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]
    spanning = 0
    for body in (a.json() for a in answers):
        vs = body["weights_versions"]
        assert vs == sorted(set(vs)) and body["weights_version"] == vs[0], body
        first = VERSIONS[vs[0] % len(VERSIONS)][0]  # turn 1 was sampled by the oldest version
        assert body["turns"][0]["search_query"] == first or len(vs) > 1, body
        spanning += len(vs) > 1
    print(f"\n{len(answers)} /answer under answer_consistency=latest, {spanning} spanning two versions")


def check_training_turns(
    groups: list[TrajectoryGroup], weights: list[Path], tmp: Path, one_version_per_turn: bool = True
) -> None:
    from llds_trainer.batch import samples_from_groups
    from llds_trainer.core import Trainer

    samples = samples_from_groups(groups)
    spans: list[tuple[int, int, int, int]] = []  # sample, start, end, version
    for i, s in enumerate(samples):
        turns = runs(s.loss_mask, 1)
        vs = []
        for a, e in turns:
            if one_version_per_turn:
                assert len(set(s.versions[a:e])) == 1, f"one engine call, versions {set(s.versions[a:e])}"
            for a2, e2 in version_runs(s.versions, a, e):
                vs.append(s.versions[a2])
                spans.append((i, a2, e2, s.versions[a2]))
        assert vs == sorted(vs), f"versions go backwards: {vs}"
    scored = {
        k: Trainer(trainer_config(w, tmp / f"t{k}")).scorer.score(samples, entropy=False, ref=False)[0]
        for k, w in enumerate(weights)
    }
    tol_max = TOLERANCES["vllm"][0]
    worst = 0.0
    for i, a, e, v in spans:
        d = (scored[v % len(weights)][i][a:e] - torch.tensor(samples[i].logprobs[a:e])).abs().max()
        worst = max(worst, float(d))
        assert float(d) <= tol_max, f"turn of version {v}: max |delta| {float(d):.2e} under its own weights"
    versions = {v for *_, v in spans}
    crossing = sum(1 for s in samples if len({s.versions[a] for a, _ in runs(s.loss_mask, 1)}) > 1)
    inside = sum(
        1 for s in samples for a, e in runs(s.loss_mask, 1) if len(version_runs(s.versions, a, e)) > 1
    )
    print(
        f"{len(samples)} training trajectories, versions {sorted(versions)}, {crossing} with turns of two "
        f"versions, {inside} turns a swap reached in flight, max |delta| under the recorded version {worst:.2e}"
    )
    assert len(versions) >= 3


def version_runs(versions: list[int], a: int, e: int) -> list[tuple[int, int]]:
    """``[a, e)`` cut where the recorded version changes."""
    cuts = [i for i in range(a + 1, e) if versions[i] != versions[i - 1]]
    bounds = [a, *cuts, e]
    return list(itertools.pairwise(bounds))
