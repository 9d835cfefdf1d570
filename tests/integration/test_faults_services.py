"""Fault injection on the real services (each its own process unless stated), the real Redis and
the tiny model: rollout killed mid-generation, retriever down, Redis restarted or killed, checkpoint
disk full.

Also part of the fault suite, elsewhere: trainer ``kill -9`` at every point of its step cycle
(``test_trainer_service.py::test_kill9_at_every_point_loses_nothing_and_trains_nothing_twice``) and
corrupt / incomplete / escaping weight folders rejected while the old weights keep serving
(``test_rollout_service.py::test_weight_update_accepts_good_and_rejects_bad_folders``).
"""

from __future__ import annotations

import hashlib
import json
import resource
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from reliability_kit import (
    PY_CLI,
    QUESTION,
    Service,
    retriever_service,
    searching_engine,
    wait_for,
    world_index,
)
from test_rollout_service import write_trainer_info

from llds.redis_server import RedisServer
from llds_proto import streams
from llds_proto.codec import decode_group, encode_group
from llds_server.http import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "faults-admin-token"


def rollout_service(
    model: Path,
    retriever_url: str,
    redis_url: str,
    tmp: Path,
    name: str = "rollout",
    env: dict[str, str] | None = None,
) -> tuple[Service, str]:
    world, _ = world_index()
    port = free_port()
    argv = [*PY_CLI, "rollout", "serve", "--engine", "transformers", "--config", str(ROOT / "configs" / "rollout_tiny.toml"),
            "--model", str(model), "--retriever-url", retriever_url, "--redis-url", redis_url,
            "--dataset", str(world / "train.jsonl"), "--weights-root", str(tmp / "weights"), "--port", str(port)]  # fmt: skip
    (tmp / "weights").mkdir(parents=True, exist_ok=True)
    # Admission starts no group before the trainer has said how fast it trains: these tests produce
    # without one (a trainer started later overwrites this with its own pace).
    write_trainer_info(redis.Redis.from_url(redis_url), groups_per_step=8)
    return Service(name, argv, tmp, {"LLDS_ADMIN_TOKEN": TOKEN, **(env or {})}), f"http://127.0.0.1:{port}"


def trainer_service(
    model: Path, redis_url: str, tmp: Path, steps: int, name: str = "trainer"
) -> tuple[Service, str]:
    port = free_port()
    argv = [*PY_CLI, "trainer", "run", "--config", str(ROOT / "configs" / "trainer_tiny.toml"),
            "--model", str(model), "--redis-url", redis_url, "--run-dir", str(tmp / "run"),
            "--weights-root", str(tmp / "weights"), "--steps", str(steps), "--port", str(port),
            "--set", "num_threads=1", "--set", "read_block_ms=200", "--set", "staleness_k=100"]  # fmt: skip
    return Service(name, argv, tmp, {"LLDS_ADMIN_TOKEN": TOKEN}), f"http://127.0.0.1:{port}"


def audit_stream(r: redis.Redis, group_size: int) -> list[str]:
    """Every entry decodes to a whole group of ``group_size`` self-consistent trajectories; returns group ids."""
    ids = []
    for eid, fields in r.xrange(streams.DEFAULT_KEYS.stream):
        field = streams.GROUP_FIELD
        g = decode_group(fields[field if isinstance(field, bytes) else field.encode()])
        assert len(g.trajectories) == group_size, (eid, g.group_id)
        for t in g.trajectories:
            n = len(t.response_ids)
            assert n > 0 and len(t.logprobs) == len(t.loss_mask) == len(t.versions) == n, t.trajectory_id
        ids.append(g.group_id)
    return ids


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    svc, url = retriever_service(tmp_path_factory.mktemp("retriever"))
    svc.start()
    try:
        svc.wait_healthy(url)
        yield url
    finally:
        svc.stop()


# ---------------------------------------------------------------------------- rollout killed


def test_rollout_kill9_mid_generation_leaves_only_whole_groups(
    tiny_model_dir: Path, retriever: str, redis_url: str, tmp_path: Path
) -> None:
    r = redis.Redis.from_url(redis_url)
    svc, url = rollout_service(tiny_model_dir, retriever, redis_url, tmp_path)
    svc.start()
    try:
        svc.wait_healthy(url)
        wait_for(lambda: r.xlen(streams.DEFAULT_KEYS.stream) >= 2, 120, "two groups on the stream")

        def generating() -> bool:
            text = httpx.get(f"{url}/metrics", timeout=2).text
            line = next(x for x in text.splitlines() if x.startswith("llds_rollout_trajectories_in_flight "))
            return float(line.split()[1]) > 0

        wait_for(generating, 30, "trajectories in flight", interval_s=0.01)
        svc.kill9()  # mid-generation: groups in flight are half done
        assert svc.proc is not None and svc.proc.returncode == -9
        before = r.xlen(streams.DEFAULT_KEYS.stream)
        ids = audit_stream(r, group_size=2)  # rollout_tiny: G = 2
        assert len(ids) == before >= 2 and len(set(ids)) == len(ids)
        # a restarted replica produces again on the same stream; every entry is still whole
        svc2, url2 = rollout_service(tiny_model_dir, retriever, redis_url, tmp_path, name="rollout-2")
        svc2.start()
        try:
            svc2.wait_healthy(url2)
            wait_for(lambda: r.xlen(streams.DEFAULT_KEYS.stream) > before, 120, "groups after the restart")
        finally:
            assert svc2.stop() in (0, -15), svc2.log()  # uvicorn re-raises SIGTERM after a clean shutdown
        assert "Application shutdown complete" in svc2.log()
        audit_stream(r, group_size=2)
    finally:
        svc.stop()


# ---------------------------------------------------------------------------- retriever down


@pytest.mark.slow
def test_retriever_down_10s_answer_503_then_recovers_without_restart(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    """The rollout (in-process, forced to search on every first turn) outlives a 10 s retriever outage."""
    from llds_rollout.app import create_app
    from llds_rollout.config import RolloutSettings
    from llds_server.http import BackgroundServer

    r = redis.Redis.from_url(redis_url)
    write_trainer_info(r, groups_per_step=8)  # no trainer here: a pace that lets production run
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"id": "q0", "data_source": "world", "question": QUESTION,
                                   "golden_answers": ["x"], "extra_info": {"index": 0}}) + "\n")  # fmt: skip
    port = free_port()
    ret, ret_url = retriever_service(tmp_path, port=port)
    settings = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "retriever_url": ret_url, "redis_url": redis_url,
                   "dataset": dataset, "weights_root": tmp_path, "group_size": 2, "max_turns": 1,
                   "answer_max_turns": 1, "max_tokens_per_turn": 12, "max_groups_in_flight": 1,
                   "retriever_retries": 2, "retriever_backoff_s": 0.2, "retriever_timeout_s": 2.0}
    )  # fmt: skip
    ret.start()
    try:
        ret.wait_healthy(ret_url)
        with BackgroundServer(create_app(settings, searching_engine(tiny_model_dir, QUESTION))) as srv:
            wait_for(lambda: httpx.get(f"{srv.url}/health").status_code == 200, 60, "rollout ready")
            ok = httpx.post(f"{srv.url}/answer", json={"question": QUESTION}, timeout=60)
            assert ok.status_code == 200 and ok.json()["turns"][0]["documents"], ok.text
            wait_for(lambda: r.xlen(streams.DEFAULT_KEYS.stream) >= 1, 60, "a group before the outage")

            ret.kill9()
            down_at = time.monotonic()
            answers = []
            while time.monotonic() - down_at < 10.0:
                resp = httpx.post(f"{srv.url}/answer", json={"question": QUESTION}, timeout=60)
                answers.append(resp)
            assert answers and all(a.status_code == 503 for a in answers), [a.text for a in answers]
            assert all(a.headers.get("retry-after") == "1" for a in answers)
            assert all("retriever unavailable" in a.json()["detail"] and "3 attempts" in a.json()["detail"]
                       for a in answers)  # fmt: skip
            assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"  # degraded answers, live service
            stalled = r.xlen(streams.DEFAULT_KEYS.stream)
            metrics = httpx.get(f"{srv.url}/metrics").text
            assert 'llds_rollout_groups_total{status="failed"}' in metrics

            ret.start()  # same port, same index: the rollout is not restarted
            ret.wait_healthy(ret_url)
            back = httpx.post(f"{srv.url}/answer", json={"question": QUESTION}, timeout=60)
            assert back.status_code == 200 and back.json()["turns"][0]["documents"], back.text
            wait_for(lambda: r.xlen(streams.DEFAULT_KEYS.stream) > stalled, 60, "groups after the outage")
            print(f"outage {time.monotonic() - down_at:.1f} s, {len(answers)} answers refused with 503")
        audit_stream(r, group_size=2)
    finally:
        ret.stop()


# ---------------------------------------------------------------------------- redis restarted


@pytest.mark.slow
def test_redis_restart_keeps_acknowledged_data_and_everyone_reconnects(
    tiny_model_dir: Path, retriever: str, tmp_path: Path
) -> None:
    server = RedisServer(data_dir=tmp_path / "redis").start()
    r = redis.Redis.from_url(server.url)
    # Backpressure would rightly hold production while the backlog waits for the trainer; this test
    # is about reconnecting, so the producer must keep producing after the restart.
    rollout, rollout_url = rollout_service(
        tiny_model_dir, retriever, server.url, tmp_path, env={"LLDS_ROLLOUT_MAX_QUEUED_GROUPS": "0"}
    )
    trainer, trainer_url = trainer_service(tiny_model_dir, server.url, tmp_path, steps=4)
    try:
        rollout.start()
        trainer.start()
        rollout.wait_healthy(rollout_url)
        wait_for(lambda: httpx.get(f"{trainer_url}/status").json()["step"] >= 1, 180, "trainer step 1")

        # The trainer trims what it acknowledges; frozen while Redis restarts, it cannot remove entries
        # under the survival checks (it reconnects once thawed, below).
        assert trainer.proc is not None
        trainer.proc.send_signal(signal.SIGSTOP)
        # graceful restart (SIGTERM: the append-only file is flushed): every entry survives
        before = [e for e, _ in r.xrange(streams.DEFAULT_KEYS.stream)]
        group_before = r.xinfo_groups(streams.DEFAULT_KEYS.stream)[0]
        server.stop()
        time.sleep(2.0)
        server.start()
        after = {e for e, _ in r.xrange(streams.DEFAULT_KEYS.stream)}
        assert set(before) <= after
        group_after = r.xinfo_groups(streams.DEFAULT_KEYS.stream)[0]
        assert group_after["last-delivered-id"] >= group_before["last-delivered-id"]

        # crash (SIGKILL): entries older than the 1 s fsync interval survive
        older = [e for e, _ in r.xrange(streams.DEFAULT_KEYS.stream)]
        time.sleep(2.5)
        server.kill()
        server.start()
        assert set(older) <= {e for e, _ in r.xrange(streams.DEFAULT_KEYS.stream)}
        last_id = lambda: r.xinfo_stream(streams.DEFAULT_KEYS.stream)["last-generated-id"]  # noqa: E731
        restarted_at = last_id()
        trainer.proc.send_signal(signal.SIGCONT)

        # producer and consumer reconnect by themselves: new groups arrive, the trainer finishes
        wait_for(lambda: last_id() > restarted_at, 120, "a group after restart")
        rc = trainer.proc.wait(240)
        assert rc == 0, trainer.log()
        assert httpx.get(f"{rollout_url}/health").json()["status"] == "ok"
    finally:
        trainer.stop()
        rollout.stop()
        server.stop()
    cps = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    state = json.loads((cps[-1] / "state.json").read_text())
    assert state["step"] == 4 and len(state["consumed"]) == len(set(state["consumed"])) == 4


# ---------------------------------------------------------------------------- disk full


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.slow
def test_checkpoint_disk_full_stops_with_a_clear_error_and_keeps_the_previous_checkpoint(
    tiny_model_dir: Path, tokenizer: Any, redis_url: str, tmp_path: Path
) -> None:
    """A full disk, simulated with RLIMIT_FSIZE in the trainer process: writing a file past the limit
    fails with EFBIG (Python ignores SIGXFSZ), through the trainer's real checkpoint code path."""
    from llds_trainer.synthetic import synthetic_groups

    r = redis.Redis.from_url(redis_url)
    groups = synthetic_groups(tokenizer, 3, 3, seed=11, think_words=3, doc_words=8)
    for g in groups:
        r.xadd(streams.DEFAULT_KEYS.stream, {streams.GROUP_FIELD: encode_group(g)})

    first, _ = trainer_service(tiny_model_dir, redis_url, tmp_path, steps=1, name="trainer-1")
    assert first.start().proc is not None and first.proc.wait(180) == 0, first.log()
    cp1 = tmp_path / "run" / "checkpoints" / "step_00000001"
    good = _hashes(cp1)
    model_b, optim_b = (cp1 / "model.safetensors").stat().st_size, (cp1 / "optimizer.pt").stat().st_size
    assert optim_b > model_b * 1.5, (model_b, optim_b)
    limit = (model_b + optim_b) // 2  # the published weights fit, the optimizer state does not

    def fill_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    full, _ = trainer_service(tiny_model_dir, redis_url, tmp_path, steps=2, name="trainer-full")
    full.start(preexec_fn=fill_disk)
    assert full.proc is not None
    rc = full.proc.wait(180)
    log = full.log(20000)
    assert rc == 1, log
    assert "trainer failed" in log and "CheckpointError: writing checkpoint step 2" in log, log[-3000:]
    assert "the previous checkpoint is untouched" in log
    assert not list((tmp_path / "run" / "checkpoints").glob(".step_*"))  # the partial folder is removed
    # the previous checkpoint is untouched and still the newest complete one
    cps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert cps == ["step_00000001"] and _hashes(cp1) == good
    # the step's group was not acknowledged: it stays pending for the next run
    assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 1

    again, _ = trainer_service(tiny_model_dir, redis_url, tmp_path, steps=2, name="trainer-3")
    assert again.start().proc is not None and again.proc.wait(180) == 0, again.log()
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_00000002" / "state.json").read_text())
    assert state["consumed"] == [g.group_id for g in groups[:2]]
    assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 0
