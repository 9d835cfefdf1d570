"""Scale-out: two rollout replicas register themselves in Redis and both receive weight updates;
the registry heals when one dies.

Two real rollout processes (tiny model) and one real trainer process share a real Redis server and a
weights root. Once both serve version 1, replica-1 is killed with SIGKILL (no deregistration): the
trainer prunes it when its heartbeat is older than ``replica_ttl_s``, training goes on, and
replica-0 gets every version up to the last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from llds.up import ensure_world, ensure_world_index
from llds_proto import streams
from llds_server.http import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "scaleout-test-token"


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "llds.cli", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "LLDS_ADMIN_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", **env},
        start_new_session=True,
    )


def _wait(url: str, cond, timeout: float, procs: list[subprocess.Popen[bytes]]) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"a service exited with {p.returncode}"
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200 and cond(r.json()):
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting on {url}")


STEPS = 8


def test_two_rollout_replicas_receive_updates_and_a_dead_one_is_pruned(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    world, index = ensure_world(0), ensure_world_index(0)
    weights = tmp_path / "weights"
    weights.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        rport = free_port()
        procs.append(
            _spawn(
                ["retriever", "serve", "--index", str(index), "--port", str(rport)], tmp_path / "ret.log", {}
            )
        )
        _wait(f"http://127.0.0.1:{rport}/health", lambda b: b["status"] == "ok", 120, procs)
        urls = []
        for i in range(2):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            procs.append(
                _spawn(
                    ["rollout", "serve", "--engine", "transformers", "--config", str(ROOT / "configs" / "rollout_tiny.toml"),
                     "--model", str(tiny_model_dir), "--retriever-url", f"http://127.0.0.1:{rport}",
                     "--redis-url", redis_url, "--dataset", str(world / "train.jsonl"),
                     "--weights-root", str(weights), "--port", str(port)],
                    tmp_path / f"rollout{i}.log",
                    {"LLDS_ROLLOUT_REPLICA_NAME": f"replica-{i}", "LLDS_ROLLOUT_PUBLIC_URL": urls[-1],
                     "LLDS_ROLLOUT_HEARTBEAT_S": "0.5"},
                )
            )  # fmt: skip
        for u in urls:
            _wait(f"{u}/health", lambda b: b["status"] == "ok", 180, procs)
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        deadline = time.monotonic() + 30
        while len(r.hgetall(streams.DEFAULT_KEYS.registry)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert r.hgetall(streams.DEFAULT_KEYS.registry) == {"replica-0": urls[0], "replica-1": urls[1]}

        tport = free_port()
        procs.append(
            _spawn(
                ["trainer", "run", "--config", str(ROOT / "configs" / "trainer_tiny.toml"),
                 "--model", str(tiny_model_dir), "--redis-url", redis_url, "--run-dir", str(tmp_path / "run"),
                 "--weights-root", str(weights), "--steps", str(STEPS), "--port", str(tport),
                 "--set", "replica_ttl_s=3"],
                tmp_path / "trainer.log",
                {},
            )
        )  # fmt: skip
        for u in urls:
            _wait(f"{u}/health", lambda b: b["detail"].get("weights_version", 0) >= 1, 300, procs)
        dead = procs.pop(2)  # replica-1
        os.killpg(dead.pid, 9)
        dead.wait(30)
        body = _wait(
            f"{urls[0]}/health", lambda b: b["detail"].get("weights_version", 0) >= STEPS, 300, procs[:-1]
        )
        assert body["detail"]["weights_version"] == STEPS
        log = (tmp_path / "trainer.log").read_text()
        assert log.count(f"notified {urls[0]} of version") == STEPS, log[-3000:]
        assert "pruned replica replica-1" in log, log[-3000:]
        assert r.hgetall(streams.DEFAULT_KEYS.registry) == {"replica-0": urls[0]}
        assert [n for n, _ in r.zrange(streams.DEFAULT_KEYS.heartbeats, 0, -1, withscores=True)] == [
            "replica-0"
        ]
        # a notice to the dead replica fails at most until the prune, never after it
        last_fail = (
            max(i for i, line in enumerate(log.splitlines()) if f"notify {urls[1]}" in line)
            if f"notify {urls[1]}" in log
            else -1
        )
        prune = next(i for i, line in enumerate(log.splitlines()) if "pruned replica replica-1" in line)
        assert last_fail < prune
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
