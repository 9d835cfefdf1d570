"""Scale-out: two rollout replicas register themselves in Redis and both receive every weight update.

Two real rollout processes (tiny model) and one real trainer process share a real Redis server and a
weights root; after the trainer's 2 steps both replicas serve version 2.
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


def test_two_rollout_replicas_both_receive_every_update(
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
                    {"LLDS_ROLLOUT_REPLICA_NAME": f"replica-{i}", "LLDS_ROLLOUT_PUBLIC_URL": urls[-1]},
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
                 "--weights-root", str(weights), "--steps", "2", "--port", str(tport)],
                tmp_path / "trainer.log",
                {},
            )
        )  # fmt: skip
        for u in urls:
            body = _wait(f"{u}/health", lambda b: b["detail"].get("weights_version", 0) >= 2, 300, procs[:-1])
            assert body["detail"]["weights_version"] == 2
        log = (tmp_path / "trainer.log").read_text()
        for u in urls:
            assert log.count(f"notified {u} of version") == 2, log[-3000:]
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
